"""The ``labkit serve`` command itself, on the real default model, in its own process.

It must answer a chat as the offline engine does (same greedy text), and stop on SIGTERM
with a request still streaming: the stream ends with an error event, the process ends, nothing hangs.
"""

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
from lazy_import import lazy_module

from labkit.engine import LLM
from labkit.models.int8_linear import ENGINE_VARIABLE
from labkit.sampling import SamplingParams
from labkit.serve.serve_cli import add_arguments, engine_dials

openai = lazy_module("openai")  # on first use: collecting this file need not import the client

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
DIALS = ["--max-num-seqs", "4", "--max-model-len", "1024", "--num-gpu-blocks-override", "256"]


@contextlib.contextmanager
def serving(*flags: str, env: dict[str, str] | None = None):
    """``labkit serve`` with ``flags`` in its own process: (process, its URL, what it said before listening)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "labkit.cli", "serve", "--port", "0", "--shutdown-timeout", "1", *DIALS, *flags],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    try:
        url, said = None, []
        for line in process.stderr:  # the command says where it listens once the model is loaded
            said.append(line)
            found = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)
            if found:
                url = found.group(1)
                break
        assert url, f"labkit serve never said where it listens (exit code {process.poll()}): {''.join(said)}"
        yield process, url, "".join(said)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
        process.stderr.close()


@pytest.fixture(scope="module")
def served(default_model):  # loaded (and converted, the first time) before the subprocess starts
    with serving() as (process, url, _):
        yield process, url


def test_the_command_serves_the_default_model_as_the_engine_would(served, default_model):
    process, url = served
    assert httpx.get(url + "/health").status_code == 200
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    [listed] = client.models.list().data
    answer = client.chat.completions.create(model=listed.id, messages=CHAT, max_tokens=16, temperature=0)
    offline = LLM(default_model, max_model_len=1024, num_blocks=256).generate(
        CHAT, SamplingParams(max_tokens=16), use_tqdm=False
    )[0]
    assert answer.choices[0].message.content == offline.text
    assert "Paris" in offline.text  # a real model, answering for real


def test_sigterm_stops_it_with_a_stream_in_flight(served):
    process, url = served
    body = {"prompt": "Once upon a time", "max_tokens": 900, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert json.loads(next(line for line in lines if line.startswith("data: "))[6:])["choices"]
        process.send_signal(signal.SIGTERM)
        # requests in flight get --shutdown-timeout (1 s) to finish; this one cannot, so it is ended with an
        # error event its client can read, then [DONE]
        data = [line for line in lines if line.startswith("data: ")]
    assert len(data) < 900 and data[-1] == "data: [DONE]"
    assert json.loads(data[-2][len("data: ") :])["error"]["code"] == "server_shutting_down"
    started = time.monotonic()
    while process.poll() is None:
        assert time.monotonic() - started < 60, "labkit serve did not exit after SIGTERM"
        time.sleep(0.05)
    assert process.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has shut down
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health")


@pytest.mark.parametrize(
    "flags, expected",
    [([], None), (["--enable-prefix-caching"], True), (["--no-enable-prefix-caching"], False)],
)
def test_the_prefix_caching_flag_reaches_the_engine_only_when_given(flags, expected):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    dials = engine_dials(parser.parse_args(flags))
    assert dials.get("enable_prefix_caching") == expected  # left out: the engine's default (on, as vLLM V1)


def test_the_deterministic_flag_reaches_the_engine_only_when_given():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert engine_dials(parser.parse_args(["--deterministic"]))["deterministic"] is True
    assert "deterministic" not in engine_dials(parser.parse_args([]))  # the engine's default


def test_the_speculative_config_is_json_as_in_vllm(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = '{"method": "ngram", "num_speculative_tokens": 3}'
    assert engine_dials(parser.parse_args(["--speculative-config", config]))["speculative_config"] == {
        "method": "ngram",
        "num_speculative_tokens": 3,
    }
    assert "speculative_config" not in engine_dials(parser.parse_args([]))  # off unless asked for
    for bad, said in (("{method: ngram}", "not valid JSON"), ("[3]", "expected a JSON object")):
        with pytest.raises(SystemExit):
            parser.parse_args(["--speculative-config", bad])
        assert said in capsys.readouterr().err


def test_int8_is_served_end_to_end_as_the_engine_computes_it(default_model):
    offline = LLM(default_model, quantization="int8", max_model_len=1024, num_blocks=256)
    if offline.quantization.quantization != "int8":
        pytest.skip(f"no int8 kernel here: {offline.quantization.reason}")
    expected = offline.generate(CHAT, SamplingParams(max_tokens=16), use_tqdm=False)[0].text
    pin = {ENGINE_VARIABLE: offline.quantization.engine}  # the fastest is a race: the server must run the same one
    with serving("--quantization", "int8", env=pin) as (process, url, said):
        assert "computes in float32 (loaded so for int8: its linears line says what the rest computes in)" in said
        kernel = offline.quantization.describe().split(",")[0]  # "int8 (fbgemm int8 kernels (...)": why may differ
        assert f"linears {kernel}" in said
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        [listed] = client.models.list().data
        answer = client.chat.completions.create(model=listed.id, messages=CHAT, max_tokens=16, temperature=0)
    assert answer.choices[0].message.content == expected and expected.strip()


def test_an_unsupported_quantization_is_refused_naming_what_is_served(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--quantization", "int8"]).quantization == "int8"
    assert parser.parse_args([]).quantization is None  # off unless asked for, as in vLLM
    for bad in ("int4", "awq"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--quantization", bad])
        err = capsys.readouterr().err
        assert f"quantization {bad!r} is not supported" in err and "labkit serves 'int8'" in err
