"""labkit's one rule for the highest rate that keeps a promise, and its adapters from the three shapes of a run."""

import math

import numpy as np
import pytest

from labkit.metrics import summarize
from labkit.slo import Measured, Promise, from_requests, from_summary, highest_rate, keeps
from labkit.trace import RequestRecord, Trace


def run(p99_tpot_ms: float, p99_ttft_ms: float = 100.0, lost: int = 0) -> Measured:
    return Measured(p99_ttft_ms, p99_tpot_ms, lost)


SWEEP = {1.0: run(50), 2.0: run(80), 4.0: run(200), 8.0: run(90)}


def test_the_highest_rate_is_the_one_below_the_first_broken_promise():
    assert highest_rate(SWEEP, Promise(tpot_ms=100)) == 2.0  # 8 passing after 4 failed is noise, not capacity
    assert highest_rate(dict(reversed(SWEEP.items())), Promise(100)) == 2.0  # the order given does not matter
    assert highest_rate(SWEEP, Promise(250)) == 8.0
    assert highest_rate(SWEEP, Promise(80)) == 2.0  # the promise is "at most", not "below"
    assert highest_rate(SWEEP, Promise(40)) is None  # the lowest rate breaks it
    assert highest_rate({}, Promise(40)) is None


def test_a_lost_request_or_a_late_first_token_breaks_the_promise():
    assert not keeps(run(10, lost=1), Promise(100))  # however fast the others were
    assert highest_rate({1.0: run(50), 2.0: run(50, lost=1), 4.0: run(50)}, Promise(100)) == 1.0
    queued = {rate: run(50, p99_ttft_ms=100 * rate) for rate in (1.0, 2.0, 4.0)}
    assert highest_rate(queued, Promise(tpot_ms=100, ttft_ms=250)) == 2.0
    assert highest_rate(queued, Promise(tpot_ms=100)) == 4.0  # without a TTFT limit the queue is not seen
    assert not keeps(run(math.nan), Promise(100))  # nothing served: no p99 keeps anything


def test_a_promise_names_its_bad_limit():
    assert Promise.from_limits({"ttft_ms": 1000, "tpot_ms": 100}) == Promise(tpot_ms=100, ttft_ms=1000)
    assert Promise.from_limits({"tpot_ms": 100}).describe() == "p99 TPOT <= 100 ms and nothing lost"
    with pytest.raises(ValueError, match="needs a 'tpot_ms' limit"):
        Promise.from_limits({"ttft_ms": 1000})
    with pytest.raises(ValueError, match="'e2el'"):
        Promise.from_limits({"tpot_ms": 100, "e2el": 5})
    with pytest.raises(ValueError, match="tpot_ms limit must be a positive number of ms, got -1"):
        Promise(-1)
    with pytest.raises(ValueError, match="ttft_ms limit must be a positive number of ms, got '1s'"):
        Promise(100, ttft_ms="1s")


def test_measured_requests_are_read_as_the_lab_reads_them():
    requests = [{"ok": True, "ttft_ms": 10.0 * i, "tpot_ms": float(i)} for i in range(1, 7)]
    result = from_requests(requests)
    assert result == Measured(np.percentile([10.0 * i for i in range(1, 7)], 99), np.percentile(range(1, 7), 99), 0)
    lossy = from_requests([*requests, {"ok": False, "ttft_ms": None, "tpot_ms": None}])
    assert lossy.lost == 1 and lossy.p99_tpot_ms == result.p99_tpot_ms  # the p99 is over the served ones
    assert from_requests([{"ok": False, "ttft_ms": None, "tpot_ms": None}]).lost == 1


def test_a_load_tests_summary_is_read_with_its_own_p99s():
    served = RequestRecord("a", 0.0, 8, token_times=[0.1, 0.2, 0.4], finish_time=0.4, finish_reason="length")
    refused = RequestRecord("b", 0.0, 8, token_times=[], finish_time=None, finish_reason="rejected")
    summary = summarize(Trace(requests=[served, refused]))
    assert from_summary(summary) == Measured(summary.ttft_ms.p99, summary.tpot_ms.p99, 1)
    assert from_summary(summary).p99_tpot_ms == pytest.approx(150.0)
