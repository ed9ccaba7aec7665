"""``labkit serve`` against clients that leave or hog: the last attack checks of issue #49.

A non-streamed request whose client closes its socket (right after sending, or while the engine
works on it) is aborted and its blocks freed, as a streamed one is; ``/health`` and ``/metrics``
answer 200 while every connection the server allows is held by an idle or slow socket. Nothing
asserts a duration: each test waits for the state it expects, bounded only against a hang.
"""

import http.client
import json
import socket

import httpx
import pytest
from test_serve import CHAT, NUM_BLOCKS, TEXT, chat_model, make_llm, scrape, slow_attention, wait_for
from tiny_server import closed_by_server

from labkit.sampling import SamplingParams
from labkit.serve import guard
from labkit.serve.server import ServerThread

LIMIT = 8  # max_connections in the connection tests


@pytest.fixture(scope="module")
def model():
    return chat_model()


def raw_post(sock: socket.socket, path: str, body: dict) -> None:
    data = json.dumps(body).encode()
    sock.sendall(
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" % path.encode()
        + b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
    )


# --- a non-streamed client that leaves is aborted ------------------------------------------
@pytest.mark.parametrize("when", ["at once", "while it runs"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_non_streamed_client_that_closes_is_aborted_and_its_blocks_freed(model, path, when):
    llm = make_llm(model, attention=slow_attention)
    name = llm.describe()["model"]
    prompt = {"messages": CHAT} if "chat" in path else {"prompt": TEXT}
    alone = make_llm(model).generate(TEXT, SamplingParams(max_tokens=8), use_tqdm=False)[0].text
    with ServerThread(llm) as server:
        host, port = server.socket.getsockname()[:2]
        leaver = socket.create_connection((host, port), timeout=60)
        raw_post(leaver, path, {"model": name, **prompt, "max_tokens": 1500, "ignore_eos": True})
        if when == "while it runs":
            wait_for(lambda: scrape(server.url)["vllm:generation_tokens_total"] >= 3, "a few tokens")
        leaver.close()  # a full close: to the server, a FIN like a half-close's until it writes
        stayer = httpx.post(
            server.url + "/v1/completions",
            json={"model": name, "prompt": TEXT, "max_tokens": 8, "temperature": 0},
            timeout=60,
        )
        assert stayer.json()["choices"][0]["text"] == alone  # the one beside it is unaffected
        wait_for(lambda: not llm.has_unfinished(), "the engine dropped the request")
        assert llm.state.blocks.num_free_blocks == NUM_BLOCKS
        after = scrape(server.url)
        assert after["vllm:request_success_total{finished_reason=abort}"] == 1
        assert after["vllm:request_success_total{finished_reason=length}"] == 1  # the stayer
        assert after["vllm:num_requests_running"] == 0
        assert after["vllm:generation_tokens_total"] < 1500
        assert httpx.get(server.url + "/health").status_code == 200


def test_a_half_closed_client_is_probed_yet_answered_by_a_real_http_client(model):
    """The probes are interim ``100 Continue`` responses, which a client skips (here the standard library's)."""
    llm = make_llm(model, attention=slow_attention)
    with ServerThread(llm) as server:
        host, port = server.socket.getsockname()[:2]
        connection = http.client.HTTPConnection(host, port, timeout=60)
        body = {"model": llm.describe()["model"], "prompt": TEXT, "max_tokens": 60, "ignore_eos": True}
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        assert connection.sock is not None
        connection.sock.shutdown(socket.SHUT_WR)
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["usage"]["completion_tokens"] == 60
        connection.close()
        assert scrape(server.url)["vllm:request_success_total{finished_reason=length}"] == 1  # long enough to probe


# --- health and metrics answer while every connection is held ------------------------------
def hold(server, how: str) -> list[socket.socket]:
    """``LIMIT`` connections once the server has them all: idle, sending their headers a byte at a time, or busy
    (headers read, the body awaited: a request in progress, which the server never closes to make room)."""
    host, port = server.socket.getsockname()[:2]
    held = [socket.create_connection((host, port)) for _ in range(LIMIT)]
    for sock in held:
        if how == "slow":
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHo")  # slowloris: headers never finished
        elif how == "busy":
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Expect: 100-continue\r\nContent-Length: 1000\r\n\r\n"
            )
            sock.settimeout(60)
            assert sock.recv(100).startswith(b"HTTP/1.1 100")  # its headers are read: it is busy now
    wait_for(lambda: len(server.server.server_state.connections) == LIMIT, "the server holds them all")
    return held


@pytest.mark.parametrize("how", ["idle", "slow"])
def test_connections_that_sent_no_request_make_room_for_health_metrics_and_work(model, how):
    """Idle or slowloris sockets holding every connection cannot make a healthy replica look dead: the oldest
    such connection is closed for each new one (as nginx reuses idle keep-alive connections)."""
    with ServerThread(make_llm(model), max_connections=LIMIT, read_timeout=60) as server:
        held = hold(server, how)
        for _ in range(2 * guard.HEADROOM):
            assert httpx.get(server.url + "/health", timeout=5).status_code == 200
            metrics = httpx.get(server.url + "/metrics", timeout=5)
            assert metrics.status_code == 200 and "vllm:num_requests_running" in metrics.text
        answered = httpx.post(server.url + "/v1/completions", json={"prompt": TEXT, "max_tokens": 2}, timeout=30)
        assert answered.status_code == 200
        assert closed_by_server(held[0]) == b""  # the oldest hog went first
        for sock in held:
            sock.close()


def test_with_every_connection_busy_only_health_gets_the_headroom_and_must_ask_at_once(model):
    with ServerThread(make_llm(model), max_connections=LIMIT, read_timeout=60) as server:
        held = hold(server, "busy")
        refused = httpx.post(server.url + "/v1/completions", json={"prompt": TEXT, "max_tokens": 2}, timeout=5)
        assert refused.status_code == 503  # the headroom is for health and metrics only
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
        host, port = server.socket.getsockname()[:2]
        silent = socket.create_connection((host, port))
        assert closed_by_server(silent, limit_s=30) == b""  # after HEADROOM_HEADER_S (2 s), not read_timeout (60 s)
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
        for sock in held + [silent]:
            sock.close()
