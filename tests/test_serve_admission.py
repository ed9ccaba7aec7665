"""Admission control: labkit's rule on hand-made queues, and the hook inside a real server on loopback.

The rule is arithmetic, so its tests are exact (the typical slips each have a case that catches
them: the newcomer forgotten in the line, a wait reported in ms or rounded down, Retry-After 0).
The server tests use the tiny model behind the default tokenizer (see ``test_serve``), with
attention slowed a little so a burst really finds the seats taken; nothing asserts a duration.
"""

import argparse
import asyncio
import math

import httpx
import pytest
from test_serve import chat_model, make_llm, slow_attention, stream_events, wait_for

from labkit.sampling import SamplingParams
from labkit.serve.admission import QueueSnapshot, admission_within, predicted_wait_s, retry_after
from labkit.serve.protocol import APIError
from labkit.serve.serve_cli import add_arguments, admission_hook
from labkit.serve.server import ServerThread

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TEXT = "The three primary colours are"


def queue(waiting=0, running=0, max_num_seqs=2, service_s=1.0) -> QueueSnapshot:
    return QueueSnapshot(waiting=waiting, running=running, max_num_seqs=max_num_seqs, service_s=service_s)


# --- the rule ------------------------------------------------------------------------------------
def test_a_free_seat_means_no_wait():
    assert predicted_wait_s(queue(running=1, max_num_seqs=4, service_s=2.0)) == 0.0
    assert predicted_wait_s(queue(running=2, waiting=1, max_num_seqs=4, service_s=2.0)) == 0.0  # the last seat
    assert retry_after(queue(running=3, max_num_seqs=4), promise_ms=0) is None


def test_the_newcomer_counts_in_the_line():
    # two running in two seats: the newcomer is first in line for a seat, which frees up every service_s / 2
    assert predicted_wait_s(queue(running=2, max_num_seqs=2, service_s=1.0)) == pytest.approx(0.5)
    # and each one waiting ahead of it adds another service_s / max_num_seqs
    assert predicted_wait_s(queue(running=2, waiting=3, max_num_seqs=2, service_s=1.0)) == pytest.approx(2.0)
    assert predicted_wait_s(queue(running=4, waiting=10, max_num_seqs=4, service_s=2.0)) == pytest.approx(5.5)


def test_nothing_measured_yet_admits_whatever_the_queue():
    crowded = queue(running=8, waiting=100, max_num_seqs=8, service_s=None)
    assert predicted_wait_s(crowded) == 0.0
    assert retry_after(crowded, promise_ms=0) is None


def test_a_wait_equal_to_the_promise_is_kept():
    full = queue(running=2, max_num_seqs=2, service_s=1.0)  # waits 0.5 s
    assert retry_after(full, promise_ms=500) is None
    assert retry_after(full, promise_ms=499) == 1


def test_retry_after_is_whole_seconds_never_below_one():
    late = queue(running=4, waiting=10, max_num_seqs=4, service_s=2.0)  # waits 5.5 s
    assert retry_after(late, promise_ms=500) == 5  # ceil(5.5 - 0.5)
    assert retry_after(late, promise_ms=400) == 6  # ceil(5.1): rounded up, not down
    assert type(retry_after(late, promise_ms=400)) is int
    assert retry_after(queue(running=2, max_num_seqs=2, service_s=0.01), promise_ms=1) == 1  # 4 ms late: still 1


def test_the_rule_as_a_hook():
    hook = admission_within(500)
    assert hook(queue(running=2, max_num_seqs=2, service_s=1.0)) is None
    assert hook(queue(running=2, waiting=3, max_num_seqs=2, service_s=1.0)) == 2
    assert "500" in hook.__name__
    with pytest.raises(ValueError, match="0 ms or more"):
        admission_within(-1)


# --- in the server -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return chat_model()


def body(model_name: str, max_tokens: int, **extra) -> dict:
    return {"model": model_name, "prompt": TEXT, "max_tokens": max_tokens, "ignore_eos": True, **extra}


def counts(server: ServerThread) -> tuple[int, int]:
    snapshot = server.worker.queue_snapshot()
    return snapshot.waiting, snapshot.running


def test_a_burst_past_the_promise_gets_503_with_retry_after_and_the_rest_is_served(model):
    llm = make_llm(model, max_num_seqs=2, attention=slow_attention)
    name = llm.describe()["model"]
    with ServerThread(llm, admission=admission_within(1.0)) as server:
        assert server.worker.queue_snapshot() == QueueSnapshot(0, 0, 2, None)
        for _ in range(2):  # one at a time: admitted, and they teach the server its service time
            assert httpx.post(server.url + "/v1/completions", json=body(name, 8), timeout=60).status_code == 200
        measured = server.worker.queue_snapshot()
        assert measured.service_s is not None and measured.service_s > 0
        assert (measured.waiting, measured.running) == (0, 0)

        async def burst():
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
                return await asyncio.gather(*(client.post("/v1/completions", json=body(name, 32)) for _ in range(8)))

        answers = asyncio.run(burst())
        served = [a for a in answers if a.status_code == 200]
        refused = [a for a in answers if a.status_code == 503]
        assert len(served) + len(refused) == len(answers), [a.status_code for a in answers]
        assert len(served) >= 2 and refused  # two seats; a 1 ms promise refuses whoever has to wait for one
        for answer in served:
            assert answer.json()["usage"]["completion_tokens"] == 32
        for answer in refused:
            retry = answer.headers["Retry-After"]
            assert retry.isdigit() and int(retry) >= 1
            error = answer.json()["error"]
            assert error["code"] == "queue_too_long" and error["type"] == "service_unavailable"
            assert f"retry in {retry} s" in error["message"]
        wait_for(lambda: counts(server) == (0, 0), "the queue counts return to zero")
        assert not llm.has_unfinished()
        assert httpx.post(server.url + "/v1/completions", json=body(name, 4), timeout=60).status_code == 200


def test_the_counts_return_to_zero_after_hang_ups_and_rejections(model):
    llm = make_llm(model, max_num_seqs=1, attention=slow_attention)
    name = llm.describe()["model"]
    with ServerThread(llm, admission=lambda snapshot: None) as server:
        long = body(name, 1500, stream=True)
        with (
            httpx.Client(base_url=server.url, timeout=60) as first,
            httpx.Client(base_url=server.url, timeout=60) as second,
        ):
            with first.stream("POST", "/v1/completions", json=long) as running:
                events = stream_events(running)  # kept: a dropped generator would close the connection
                next(events)
                with second.stream("POST", "/v1/completions", json=long) as waiting:
                    assert waiting.status_code == 200
                    wait_for(lambda: counts(server) == (1, 1), "one running, one waiting")
        # both clients hung up: the running one and the waiting one are aborted
        wait_for(lambda: counts(server) == (0, 0), "the counts after two hang-ups")

        async def rejected_by_the_engine():  # past the server's own checks, straight to the worker
            handle = server.worker.submit([1] * 4000, SamplingParams(max_tokens=4))
            with pytest.raises(APIError) as refused:
                async for _ in handle.outputs():
                    pass
            return refused.value.status

        assert asyncio.run(rejected_by_the_engine()) == 400
        wait_for(lambda: counts(server) == (0, 0), "the counts after a rejection")
        assert httpx.post(server.url + "/v1/completions", json=body(name, 4), timeout=60).status_code == 200
        assert counts(server) == (0, 0)


@pytest.fixture(scope="module")
def hooked(model):
    """A server whose admission hook answers whatever the test sets (or raises it, if it is an exception)."""
    answer = {"value": None}

    def learner_admit(snapshot):
        if isinstance(answer["value"], Exception):
            raise answer["value"]
        return answer["value"]

    llm = make_llm(model)
    with ServerThread(llm, admission=learner_admit) as server:
        server.answer, server.name = answer, llm.describe()["model"]
        yield server


def post_with_hook_answer(hooked, value) -> httpx.Response:
    """One request while the hook answers ``value`` (then it admits again)."""
    hooked.answer["value"] = value
    try:
        return httpx.post(hooked.url + "/v1/completions", json=body(hooked.name, 4), timeout=60)
    finally:
        hooked.answer["value"] = None


@pytest.mark.parametrize(
    "bad, said",
    [
        (-1, "returned -1"),
        ("x", "returned 'x'"),
        (math.nan, "returned nan"),
        (True, "returned True"),
        (ZeroDivisionError("division by zero"), "raised ZeroDivisionError: division by zero"),
    ],
    ids=["negative", "text", "nan", "bool", "raises"],
)
def test_a_broken_hook_gives_500_naming_it_and_the_server_survives(hooked, bad, said):
    broken = post_with_hook_answer(hooked, bad)
    assert broken.status_code == 500
    error = broken.json()["error"]
    assert error["code"] == "admission_hook_failed"
    assert "learner_admit" in error["message"] and said in error["message"]
    assert counts(hooked) == (0, 0)  # the refused request was never counted
    good = httpx.post(hooked.url + "/v1/completions", json=body(hooked.name, 4), timeout=60)
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("seconds, header", [(0, "0"), (2, "2"), (2.1, "3")])
def test_a_hook_answer_becomes_a_whole_retry_after(hooked, seconds, header):
    refused = post_with_hook_answer(hooked, seconds)
    assert refused.status_code == 503 and refused.headers["Retry-After"] == header


# --- the command line ----------------------------------------------------------------------------
def test_the_cli_flag_sets_labkits_rule(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert admission_hook(parser.parse_args([])) is None  # off unless asked for
    hook = admission_hook(parser.parse_args(["--max-queue-delay-ms", "500"]))
    assert hook(queue(running=2, max_num_seqs=2, service_s=1.0)) is None
    assert hook(queue(running=2, waiting=3, max_num_seqs=2, service_s=1.0)) == 2
    for bad, said in (("-5", "0 ms or more"), ("soon", "not a number"), ("inf", "finite")):
        with pytest.raises(SystemExit):
            parser.parse_args(["--max-queue-delay-ms", bad])
        assert said in capsys.readouterr().err
    assert "labkit only" in parser.format_help()
