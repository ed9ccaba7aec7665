"""``labkit serve``, round 2: startup, shutdown, slow and hostile clients, counters and vLLM's names.

Most tests here run the real command line (``labkit serve``'s own ``run``) in a child process, on
the tiny random-weight model of ``test_serve`` (this file is also its launcher: see the end), so
signals, the open-file limit and the log are the real ones. Nothing asserts an absolute duration
except against a hang; times are compared within one run.
"""

import asyncio
import json
import logging
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
import uvicorn
from lazy_import import lazy_module
from test_serve import CHAT, TEXT, chat_model, expected_text, make_llm, scrape, wait_for
from tiny_server import TINY_SERVER, closed_by_server

from labkit.sampling import SamplingParams
from labkit.serve import guard
from labkit.serve.background import ServeProcess
from labkit.serve.server import ServerThread

openai = lazy_module("openai")  # on first use: collecting this file need not import the client

LONG = {"prompt": TEXT, "max_tokens": 1500, "ignore_eos": True}  # far longer than any grace period here


class TinyServe(ServeProcess):
    """``labkit serve`` on the tiny model, through this file's launcher."""

    launcher = (sys.executable, str(TINY_SERVER))


def launch_raw(*args: str, **popen) -> tuple[subprocess.Popen, str]:
    """The launcher as a plain child process, and its URL as soon as it prints its ready line."""
    process = subprocess.Popen(
        [sys.executable, str(TINY_SERVER), "--port", "0", *args],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        **popen,
    )
    assert process.stderr is not None
    for line in process.stderr:
        found = re.search(r" on (http://\S+)/v1", line)
        if found:
            return process, found.group(1)
    raise AssertionError(f"the server never printed its ready line (exit code {process.wait()})")


@pytest.fixture(scope="module")
def model():
    return chat_model()


# --- (a) startup: the ready line means the socket accepts ----------------------------------
def soft_256():
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def test_the_ready_line_comes_once_the_socket_accepts_and_the_soft_open_file_limit_is_raised_to_the_hard_one():
    """One child for two startup facts: its engine loop takes a second (as a big model's warm-up), and it starts
    with a soft open-file limit of 256 under a higher hard one."""
    process, url = launch_raw("--late-start", preexec_fn=soft_256)
    try:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=30).close()  # at once: no refused connection
        assert httpx.get(url + "/health", timeout=30).status_code == 200
        limits = open(f"/proc/{process.pid}/limits").read()
        soft, hard = re.search(r"Max open files\s+(\S+)\s+(\S+)", limits).groups()
        expected = 65535 if hard == "unlimited" else min(65535, int(hard))
        assert int(soft) == expected > 256
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


# --- (b) shutdown that tells the client ------------------------------------------------------
def test_serve_process_returns_once_health_answers_and_sigterm_drains_tells_every_client_and_exits_in_grace():
    grace = 2.0
    served = TinyServe("--slow", "--late-start", "--shutdown-timeout", str(grace))  # its engine starts a second late
    url, results = served.url, {}
    assert httpx.get(url + "/health", timeout=30).status_code == 200  # ServeProcess returned once it did: no retry

    def stream():
        with httpx.stream("POST", url + "/v1/completions", json={**LONG, "stream": True}, timeout=120) as response:
            results["stream"] = list(response.iter_lines())

    def whole():
        results["whole"] = httpx.post(url + "/v1/completions", json=LONG, timeout=120)

    threads = [threading.Thread(target=stream), threading.Thread(target=whole)]
    for thread in threads:
        thread.start()
    running = re.compile(r"^vllm:num_requests_running\{.*\} 2\.0$", re.MULTILINE)
    wait_for(lambda: running.search(httpx.get(url + "/metrics").text), "both requests run")
    short = threading.Thread(
        target=lambda: results.update(
            short=httpx.post(url + "/v1/completions", json={"prompt": TEXT, "max_tokens": 6}, timeout=120)
        )
    )
    short.start()
    # in flight when SIGTERM comes: seen running (on a busy machine it may take a while to arrive), or done already
    third = re.compile(r"^vllm:num_requests_running\{.*\} 3\.0$", re.MULTILINE)
    wait_for(lambda: "short" in results or third.search(httpx.get(url + "/metrics").text), "the short request runs")
    sent = time.monotonic()
    served.process.send_signal(signal.SIGTERM)
    wait_for(lambda: httpx.get(url + "/health").status_code == 503, "/health says it is draining")
    late = httpx.post(url + "/v1/completions", json={"prompt": TEXT, "max_tokens": 2}, timeout=30)
    assert late.status_code == 503 and late.json()["error"]["code"] == "server_shutting_down"
    served.process.wait(120)
    exit_s = time.monotonic() - sent
    for thread in [*threads, short]:
        thread.join(60)
    data = [line for line in results["stream"] if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    error = json.loads(data[-2][len("data: ") :])["error"]
    assert error["type"] == "service_unavailable" and "shut down" in error["message"]
    assert "--shutdown-timeout" in error["message"]  # the limit that cut it, named
    assert results["whole"].status_code == 503 and results["whole"].json()["error"]["code"] == "server_shutting_down"
    assert results["short"].status_code == 200  # in flight at SIGTERM, it finished within the grace period
    assert grace <= exit_s < grace + 10, (
        exit_s
    )  # the grace period given, then no hang (the +1 s is measured in the note)
    assert served.process.returncode in (0, -signal.SIGTERM)
    log = "\n".join(served.log)
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]


class Measured:
    """A worker stand-in that has measured ``per_token`` seconds between two tokens of a request (None: nothing)."""

    def __init__(self, per_token):
        self.per_token = per_token

    def seconds_per_token(self):
        return self.per_token


def test_the_default_drain_limit_covers_a_512_token_answer_at_the_measured_speed():
    from labkit.serve.server import DRAIN_FLOOR_S, DRAIN_MARGIN, DRAIN_TOKENS, Server

    def limit(per_token, shutdown_timeout=None):
        return Server(uvicorn.Config(app=None), Measured(per_token), shutdown_timeout).drain_limit_s()

    assert DRAIN_TOKENS == 512 and DRAIN_MARGIN >= 1
    assert limit(None) == DRAIN_FLOOR_S  # nothing measured yet: the floor
    assert limit(0.001) == DRAIN_FLOOR_S  # a fast replica: 512 tokens take less than the floor
    assert limit(0.1) == pytest.approx(512 * 0.1 * DRAIN_MARGIN)  # a slow one gets what 512 tokens take, and more
    assert limit(0.1, shutdown_timeout=3.0) == 3.0  # --shutdown-timeout decides when given


def test_a_stream_cut_by_a_thread_server_stop_gets_an_error_event_and_done(model):
    from test_serve import slow_attention

    llm = make_llm(model, attention=slow_attention)
    server = ServerThread(llm, shutdown_timeout=0.2).start()
    body = {"model": llm.describe()["model"], **LONG, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        server.stop()
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]" and "error" in json.loads(rest[-2][6:])
    assert not llm.has_unfinished() and llm.state.blocks.num_free_blocks == llm.config.num_blocks


# --- (c) bounded connections ------------------------------------------------------------------
class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def uvicorn_log():
    """The records of uvicorn's log; attach it once the server is built (uvicorn's config resets the logger)."""
    handler = Lines()
    yield handler
    logging.getLogger("uvicorn.error").removeHandler(handler)


def test_idle_and_half_open_connections_are_closed_and_slow_bodies_get_408(model, uvicorn_log):
    with ServerThread(make_llm(model), read_timeout=0.5) as server:
        logging.getLogger("uvicorn.error").addHandler(uvicorn_log)
        host, port = server.socket.getsockname()[:2]
        idle = socket.create_connection((host, port))
        half = socket.create_connection((host, port))
        half.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        trickle = socket.create_connection((host, port))
        trickle.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"prompt": '
        )
        assert closed_by_server(idle) == b"" and closed_by_server(half) == b""
        answer = closed_by_server(trickle)
        assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer
        for sock in (idle, half, trickle):
            sock.close()
        assert httpx.get(server.url + "/health").status_code == 200
    said = [r.getMessage() for r in uvicorn_log.records]
    assert any("sent no request within 0.5 s" in m for m in said) and any("408" in m for m in said)
    assert not any(r.exc_info for r in uvicorn_log.records)


def test_idle_connections_past_the_limit_make_room_and_busy_ones_get_503(model):
    with ServerThread(make_llm(model), max_connections=8) as server:
        host, port = server.socket.getsockname()[:2]
        idle = [socket.create_connection((host, port)) for _ in range(8 + guard.HEADROOM + 4)]
        # the oldest idle connections were closed to make room: health and a completion are answered
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200
        assert httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}).status_code == 200
        assert closed_by_server(idle[0]) == b""
        # connections in the middle of a request are not idle: with the limit held by them, a new connection may
        # only ask for health (or metrics), in the headroom kept for it
        busy = []
        for _ in range(8):
            sock = socket.create_connection((host, port))
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Expect: 100-continue\r\nContent-Length: 1000\r\n\r\n"
            )
            sock.settimeout(60)
            assert sock.recv(100).startswith(b"HTTP/1.1 100")  # its headers are read: it is busy now
            busy.append(sock)
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200
        turned_away = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
        assert turned_away.status_code == 503
        for sock in idle + busy:
            sock.close()
        wait_for(lambda: httpx.get(server.url + "/health").status_code == 200, "the server answers again")


def low_file_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def test_at_an_open_file_limit_of_256_idle_clients_leave_health_and_metrics_answering_and_the_log_short():
    """300 idle connections against a limit of 256 open files: the replica can serve, so /health and /metrics say
    200 (a balancer would take it out of service otherwise), and so does a request."""
    process, url = launch_raw(preexec_fn=low_file_limit)
    try:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        wait_for(lambda: httpx.get(url + "/health").status_code == 200, "it answers")
        idle = [socket.create_connection((host, int(port))) for _ in range(300)]
        assert httpx.get(url + "/health", timeout=30).status_code == 200
        assert httpx.get(url + "/metrics", timeout=30).status_code == 200
        answer = httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
        assert answer.status_code == 200
        for sock in idle:
            sock.close()
        wait_for(lambda: httpx.get(url + "/health").status_code == 200, "it answers once they are gone")
        for _ in range(5):  # clients that hang up halfway through their body
            sock = socket.create_connection((host, int(port)))
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\n\r\n{"
            )
            time.sleep(0.05)
            sock.close()
        assert httpx.get(url + "/health").status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        log = process.communicate(timeout=60)[1]
    assert "Traceback" not in log and log.count("Too many open files") <= 2, log[-3000:]  # a line, rate-limited
    assert len(log.splitlines()) < 20, log


# --- (d) counters equal what clients were sent, (e) vLLM's names ----------------------------
@pytest.fixture(scope="module")
def server(model):
    with ServerThread(make_llm(model, max_num_seqs=16)) as running:
        running.name = running.worker.llm.describe()["model"]
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_stop_string_answers_are_counted_as_sent(model, server, client):
    """The engine loop finds the stop string and ends the request before another step runs, so
    ``vllm:generation_tokens_total`` counts exactly the tokens in the clients' usage."""
    full = expected_text(model, TEXT, 48)
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    before = scrape(server.url)

    async def one(async_client, stream: bool):
        options = dict(model=server.name, prompt=TEXT, max_tokens=48, temperature=0, stop=[stop])
        if not stream:
            answer = await async_client.completions.create(**options)
            return answer.usage.completion_tokens, answer.choices[0]
        chunks = [
            c
            async for c in await async_client.completions.create(
                **options, stream=True, stream_options={"include_usage": True}
            )
        ]
        return chunks[-1].usage.completion_tokens, chunks[-2].choices[0]

    async def all_of_them():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
            return await asyncio.gather(*(one(c, i % 2 == 0) for i in range(16)))

    results = asyncio.run(all_of_them())
    sent = sum(tokens for tokens, _ in results)
    assert all(choice.finish_reason == "stop" for _, choice in results)
    assert all(choice.model_extra["stop_reason"] == stop for _, choice in results)  # vLLM's stop_reason
    wait_for(
        lambda: (
            scrape(server.url)["vllm:request_success_total{finished_reason=stop}"]
            == before.get("vllm:request_success_total{finished_reason=stop}", 0) + 16
        ),
        "all sixteen counted",
    )
    after = scrape(server.url)
    assert after["vllm:generation_tokens_total"] - before.get("vllm:generation_tokens_total", 0) == sent
    assert after["vllm:request_generation_tokens_sum"] - before.get("vllm:request_generation_tokens_sum", 0) == sent


def test_vllm_names_a_client_can_tell(model, server, client):
    chat = client.chat.completions.create(model=server.name, messages=CHAT, max_tokens=3, temperature=0)
    assert chat.id.startswith("chatcmpl-")
    assert chat.choices[0].model_extra["stop_reason"] is None  # it ran to its length
    streamed = list(client.chat.completions.create(model=server.name, messages=CHAT, max_tokens=3, stream=True))
    assert {c.id for c in streamed} == {streamed[0].id} and streamed[0].id.startswith("chatcmpl-")
    completion = client.completions.create(model=server.name, prompt=TEXT, max_tokens=3)
    assert completion.id.startswith("cmpl-")
    ids = make_llm(model).generate(TEXT, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)[0]
    stop_at = ids.outputs[0].token_ids[3]
    stopped = client.completions.create(
        model=server.name, prompt=TEXT, max_tokens=8, temperature=0, extra_body={"stop_token_ids": [stop_at]}
    )
    assert stopped.choices[0].model_extra["stop_reason"] == stop_at  # the stop token id, as vLLM says
    with pytest.raises(openai.BadRequestError, match="role tool"):
        client.chat.completions.create(
            model=server.name, messages=[*CHAT, {"role": "tool", "content": "42", "tool_call_id": "x"}], max_tokens=2
        )


def test_process_metrics_and_per_request_token_histograms(server, client):
    before = scrape(server.url)
    answers = [
        client.completions.create(model=server.name, prompt=TEXT, max_tokens=n, extra_body={"ignore_eos": True})
        for n in (2, 5)
    ]
    after = scrape(server.url)
    assert after["process_resident_memory_bytes"] > 0 and "process_cpu_seconds_total" in after
    assert "process_open_fds" in after

    def delta(name):
        return after[name] - before.get(name, 0.0)

    assert delta("vllm:request_prompt_tokens_count") == delta("vllm:request_generation_tokens_count") == 2
    assert delta("vllm:request_prompt_tokens_sum") == sum(a.usage.prompt_tokens for a in answers)
    assert delta("vllm:request_generation_tokens_sum") == 7
    edges = sorted(
        float(k.split("le=")[1].rstrip("}")) for k in after if k.startswith("vllm:request_prompt_tokens_bucket")
    )
    assert edges == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, float("inf")]  # vLLM's 1-2-5 up to max_model_len
