"""``labkit.serve.background``, the notebook's way to run ``labkit serve``: it says why a server did not
start, and it reads a load test's trace as each user saw it (lab 9 runs the rest for real)."""

import pytest

from labkit.serve.background import ServeProcess, per_request
from labkit.trace import RequestRecord, Trace


def test_a_server_that_cannot_start_is_reported_with_its_log_and_is_gone():
    with pytest.raises(RuntimeError, match="did not say where it listens") as raised:
        ServeProcess("--max-num-seqs", "many")  # refused by the command line before any model loads
    assert "--max-num-seqs" in str(raised.value)  # the server's own complaint is in the message


def test_per_request_is_what_each_user_saw():
    trace = Trace(
        requests=[
            RequestRecord("a", 1.0, 10, token_times=[1.5, 1.7, 1.9], finish_time=1.9, finish_reason="length"),
            RequestRecord("b", 2.0, 10, token_times=[2.2], finish_time=2.2, finish_reason="stop"),
            RequestRecord("c", 3.0, 10, finish_reason="rejected"),
        ]
    )
    a, b, c = per_request(trace)
    assert a["ok"] and a["ttft_ms"] == pytest.approx(500) and a["tpot_ms"] == pytest.approx(200)
    assert a["e2el_ms"] == pytest.approx(900)
    assert b["ok"] and b["tpot_ms"] == 0.0  # one token: no gap to time (vLLM counts it as 0)
    assert c == {"ok": False, "ttft_ms": None, "tpot_ms": None, "e2el_ms": None}
