"""scripts/serve_compare.py: its shipped traces load as workloads that ask for the published token counts;
labkit configurations, llama-server GGUFs and OpenVINO models become systems; the table's ratios; one trial end
to end against a fake llama-server (tests/fake_llama_server.py: the real binary is never needed here), and the
OpenVINO turn against a fake child process (OpenVINO itself: tests/test_openvino_offline_script.py)."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
from script_loader import load_script

from labkit.serve.background import ServeProcess

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def script():
    return load_script("serve_compare")


@pytest.fixture
def fake_llama(tmp_path, monkeypatch):
    """An executable 'llama-server' (the fake) and the file where it records its arguments."""
    program = tmp_path / "llama-server"
    program.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{TESTS / "fake_llama_server.py"}" "$@"\n')
    program.chmod(program.stat().st_mode | stat.S_IEXEC)
    record = tmp_path / "llama_args.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_RECORD", str(record))
    gguf = tmp_path / "model.Q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    return program, record, gguf


def one_token_per_char(messages):
    return sum(len(m["content"]) for m in messages)


@pytest.mark.parametrize("name, requests, output_tokens", [("W1", 32, 1_603), ("W2", 64, 7_340)])
def test_each_trace_is_sent_at_once_with_its_answer_lengths(script, name, requests, output_tokens):
    workload = script.trace_workload(script.WORKLOADS[name], name)
    assert len(workload) == requests
    assert sum(spec.output_len for spec in workload) == output_tokens
    assert {spec.arrival_time for spec in workload} == {0.0}
    assert all(isinstance(spec.prompt, list) and spec.prompt[-1]["role"] == "user" for spec in workload)


def test_a_trial_takes_each_traces_first_requests(script):
    whole, first = (script.trace_workload(script.WORKLOADS["W2"], "W2", n) for n in (None, 5))
    assert [spec.prompt for spec in first] == [spec.prompt for spec in whole[:5]]


def test_nothing_to_compare_is_an_error_that_says_what_to_give(script, capsys):
    with pytest.raises(SystemExit):
        script.main([])
    assert "give --labkit, --llama NAME=GGUF, --openvino NAME=FOLDER and/or --url NAME=URL" in capsys.readouterr().err


def test_labkit_configurations_are_named_and_carry_their_arguments(script, monkeypatch):
    started = []
    monkeypatch.setattr(script, "ServeProcess", lambda *args: started.append(args))
    args = script.parse_args(["--labkit", "--labkit", "int8=--quantization int8", "--labkit-args", "--max-num-seqs 64"])
    systems = script.build_systems(args)
    assert [s.name for s in systems] == ["labkit defaults", "labkit int8"]
    for system in systems:
        system.start(None)
    assert started == [("--max-num-seqs", "64"), ("--max-num-seqs", "64", "--quantization", "int8")]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--labkit", "--quantization int8"], "--labkit wants NAME=VALUE"),  # the name left out
        (["--labkit", "int8"], "--labkit wants NAME=VALUE"),
        (["--labkit", "--labkit", "defaults=--dtype float32"], "two systems share a name"),
        (["--url", "http://127.0.0.1:8080"], "--url wants NAME=VALUE"),
    ],
)
def test_a_malformed_system_says_what_form_it_wants(script, argv, message, capsys):
    with pytest.raises(SystemExit) as raised:
        script.build_systems(script.parse_args(argv))
    assert message in f"{raised.value} {capsys.readouterr().err}"


def test_a_missing_llama_server_says_how_to_get_it(script, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing here
    with pytest.raises(SystemExit) as raised:
        script.build_systems(script.parse_args(["--llama", f"Q8_0={tmp_path / 'm.gguf'}"]), one_token_per_char)
    assert "llama-server not found: give --llama-server PATH or put it on PATH" in str(raised.value)
    assert "Side by side with llama.cpp" in str(raised.value)


def test_a_missing_gguf_is_named(script, fake_llama):
    program, _, gguf = fake_llama
    argv = ["--llama", f"Q4_1={gguf.with_name('absent.gguf')}", "--llama-server", str(program)]
    with pytest.raises(SystemExit, match="--llama Q4_1: no GGUF file at .*absent.gguf"):
        script.build_systems(script.parse_args(argv), one_token_per_char)


def test_a_gguf_written_with_a_tilde_is_found_under_home(script, fake_llama, monkeypatch):
    """The README's `--llama Q8_0=~/llama-build/...`: bash expands that tilde, zsh and sh pass it on as it is."""
    program, _, gguf = fake_llama
    monkeypatch.setenv("HOME", str(gguf.parent))
    monkeypatch.setattr(script, "LlamaServer", lambda _binary, *args: args)  # the arguments, no process
    argv = ["--llama", f"Q8_0=~/{gguf.name}", "--llama-server", str(program)]
    (system,) = script.build_systems(script.parse_args(argv), one_token_per_char)
    started = system.start(script.trace_workload(script.WORKLOADS["W1"], "W1", 2))
    assert started[started.index("-m") + 1] == str(gguf)


def test_llama_server_gets_a_slot_per_request_each_holding_the_longest(script):
    workload = script.trace_workload(script.WORKLOADS["W1"], "W1")
    longest = max(one_token_per_char(s.prompt) + s.output_len for s in workload) + 64
    per_slot = -(-longest // 256) * 256
    assert script.slot_arguments(workload, one_token_per_char, []) == ["-np", "32", "-c", str(32 * per_slot)]
    assert script.slot_arguments(workload, one_token_per_char, ["-np", "8"]) == ["-c", str(8 * per_slot)]
    assert script.slot_arguments(workload, one_token_per_char, ["-np", "8", "-c", "4096"]) == []


def system(script, name, **kind):
    return script.System(name, lambda _w: None, **kind)


def test_the_ratios_at_equal_bytes_and_against_llamas_best_quantized(script):
    systems = [
        system(script, "labkit defaults", labkit="defaults"),
        system(script, "labkit int8", labkit="int8"),
        system(script, "llama Q8_0", llama="Q8_0"),
        system(script, "llama Q4_1", llama="Q4_1"),
        system(script, "llama F32", llama="F32"),  # not quantized: never "the best quantized"
    ]
    medians = {
        ("labkit defaults", "W1"): 150.0,
        ("labkit int8", "W1"): 300.0,
        ("llama Q8_0", "W1"): 200.0,
        ("llama Q4_1", "W1"): 100.0,
        ("llama F32", "W1"): 1000.0,
    }
    lines = script.ratio_lines(systems, medians, ["W1"], ["int8=Q8_0"])
    assert lines == [
        "equal bytes, labkit int8 / llama Q8_0: W1 1.50x",
        "labkit defaults / llama's best quantized: W1 0.75x (best: llama Q8_0)",
    ]
    assert script.ratio_lines(systems[2:], medians, ["W1"], ["int8=Q8_0"]) == []  # no labkit: no ratio


def test_openvino_int8_is_compared_at_equal_bytes_too_but_never_as_llamas_best(script):
    systems = [
        system(script, "labkit defaults", labkit="defaults"),
        system(script, "labkit int8", labkit="int8"),
        system(script, "llama Q8_0", llama="Q8_0"),
        system(script, "openvino int8 (offline)", openvino="int8"),
    ]
    medians = {("labkit defaults", "W1"): 100.0, ("labkit int8", "W1"): 300.0, ("llama Q8_0", "W1"): 200.0}
    medians[("openvino int8 (offline)", "W1")] = 400.0
    assert script.ratio_lines(systems, medians, ["W1"], script.parse_args(["--labkit"]).equal_bytes) == [
        "equal bytes, labkit int8 / llama Q8_0: W1 1.50x",
        "equal bytes, labkit int8 / openvino int8 (offline): W1 0.75x",
        "labkit defaults / llama's best quantized: W1 0.50x (best: llama Q8_0)",
    ]


@pytest.fixture
def exported(tmp_path, script, monkeypatch):
    """A folder that looks exported, and openvino_genai taken as installed (the child process is faked)."""
    folder = tmp_path / "SmolLM2-135M-Instruct-int8"
    folder.mkdir()
    (folder / "openvino_model.xml").write_text("<net/>")
    monkeypatch.setattr(script.importlib.util, "find_spec", lambda name: object())
    return folder


def test_openvino_without_an_exported_model_says_how_to_export_one(script, tmp_path):
    with pytest.raises(SystemExit, match="--openvino int8: no exported model in .*absent.*OpenVINO GenAI beside them"):
        script.build_systems(script.parse_args(["--openvino", f"int8={tmp_path / 'absent'}"]))


def test_openvino_without_openvino_genai_says_how_to_install_it(script, exported, monkeypatch):
    monkeypatch.setattr(script.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit, match="openvino_genai is not installed in .*install it from PyPI"):
        script.build_systems(script.parse_args(["--openvino", f"int8={exported}"]))


def test_openvino_runs_each_turn_in_a_fresh_process_on_the_traces_requests(script, exported):
    (system,) = script.build_systems(script.parse_args(["--openvino", f"int8={exported}"]))
    assert (system.name, system.openvino, system.start) == ("openvino int8 (offline)", "int8", None)
    workload = script.trace_workload(script.WORKLOADS["W2"], "W2", 5)
    command = script.openvino_command(exported, workload)
    assert command[0] == sys.executable and Path(command[1]).name == "openvino_offline.py"
    assert command[2:] == [str(exported), "--workload", "W2", "--requests", "5"]


def test_an_openvino_turn_reads_the_childs_json_and_flags_a_token_count_off_the_trace(
    script, exported, monkeypatch, capsys
):
    said = {"tokens": 10, "seconds": 2.0, "precision": "f32+u8-kv"}
    monkeypatch.setattr(script, "openvino_command", lambda *_: [sys.executable, "-c", f"print({json.dumps(said)!r})"])
    argv = ["--openvino", f"int8={exported}", "--rounds", "1", "--workloads", "W1", "--requests", "3"]
    assert script.main(argv) == 0
    out = capsys.readouterr().out
    assert "round 1 W1 openvino int8 (offline) [f32+u8-kv]: 5.0 tok/s  (!) 10 tokens, the trace asks" in out
    assert "| openvino int8 (offline) (f32+u8-kv in 1 turn(s)) | 5.0 |" in out


def test_a_failing_openvino_turn_shows_what_it_said(script, exported, monkeypatch):
    failing = [sys.executable, "-c", "import sys; sys.exit('no CPU plugin here')"]
    monkeypatch.setattr(script, "openvino_command", lambda *_: failing)
    argv = ["--openvino", f"int8={exported}", "--rounds", "1", "--workloads", "W1", "--requests", "3"]
    with pytest.raises(SystemExit, match="OpenVINO GenAI failed on W1:\\nno CPU plugin here"):
        script.main(argv)


def test_a_trial_against_a_fake_llama_server_end_to_end(script, fake_llama, monkeypatch, capsys):
    """labkit serve (the tiny model, through tests/tiny_server.py) and the fake llama-server, one
    round of W1's first three requests: both produce exactly the tokens the trace asks for."""
    program, record, gguf = fake_llama  # labkit's dtype named: its own choice is a timed race a busy machine may flip
    monkeypatch.setattr(ServeProcess, "launcher", (sys.executable, str(TESTS / "tiny_server.py")))
    argv = [
        "--labkit",
        "tiny=--max-num-seqs 4 --dtype float32",
        "--llama",
        f"Q8_0={gguf} -t 1",
        "--llama-server",
        str(program),
    ]
    argv += ["--rounds", "1", "--workloads", "W1", "--requests", "3", "--equal-bytes", "tiny=Q8_0"]
    assert script.main(argv, prompt_tokens=one_token_per_char) == 0
    out = capsys.readouterr().out
    assert "(!)" not in out and "errors" not in out, out  # every system gave the trace's token counts
    assert "round 1 W1 labkit tiny [float32]:" in out and "round 1 W1 llama Q8_0" in out
    assert "| labkit tiny (float32 in 1 turn(s)) |" in out  # what labkit chose, in the table
    assert "equal bytes, labkit tiny / llama Q8_0: W1 " in out
    (given,) = [json.loads(line) for line in record.read_text().splitlines()]
    assert given[given.index("-m") + 1] == str(gguf) and given[given.index("-np") + 1] == "3"
    assert given[-2:] == ["-t", "1"]  # the GGUF's own arguments come last


def test_serve_overhead_runs_the_offline_engine_on_the_traces_own_lengths():
    """scripts/serve_overhead.py's offline side: greedy, ignore_eos, each request its own max_new_tokens."""
    from test_serve import chat_model, make_llm

    overhead = load_script("serve_overhead")
    workload = overhead.trace_workload(overhead.WORKLOADS["W1"], "W1")[:3]
    _, tokens = overhead.offline_tokens_per_second(make_llm(chat_model()), workload)
    assert tokens == sum(spec.output_len for spec in workload)


def test_the_precision_labkit_chose_is_read_from_its_log_turn_by_turn(script):
    class Served:
        log = ["labkit serve: computes in bfloat16 (bf16 measured 1.6x as fast as fp32 on this CPU, and matches it)"]

    assert script.precision_of(Served()) == "bfloat16"
    Served.log = ["0.00.004 I srv load_model: loading model 'm.gguf'"]  # llama-server says no such thing
    assert script.precision_of(Served()) is None
