"""Load tests with known answers, for the search of the highest rate that keeps a promise (lab 9).

A real sweep costs minutes per rate and its numbers move from run to run, so the check hands
the learner's search a ``measure(rate)`` that replays seeded measurements instead: each is the
list of requests a ``labkit loadtest`` run at that rate would report, ``{"ok", "ttft_ms",
"tpot_ms", "e2el_ms"}`` (a request the server refused or broke off has ``ok`` False and no
latencies). A promise is a limit on the p99 of one or more of them, in ms, as
``labkit loadtest --goodput`` takes it: ``{"ttft_ms": 1000, "tpot_ms": 80}``. Five situations
each test one thing: a tail that only the p99 sees, a lost request, a rate that passes again
above one that failed (noise), a promise no rate keeps, and a promise with two limits where the
TTFT one breaks first.
"""

from __future__ import annotations

from typing import Any

from labkit.labs.checking.shared import rng
from labkit.slo import Promise, from_requests, highest_rate

RATES = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
NUM_REQUESTS = 20
SITUATIONS = ("tail", "lost", "noise", "hopeless", "two limits")


def _requests(r, tpot_range: tuple[float, float], promise_ms: float, over: int = 0, lost: int = 0) -> list[dict]:
    """NUM_REQUESTS measured requests with TPOT in ``tpot_range`` (as fractions of the promise), ``over``
    of them well above the promise and ``lost`` of them failed."""
    requests = []
    for i in range(NUM_REQUESTS):
        if i < lost:
            requests.append({"ok": False, "ttft_ms": None, "tpot_ms": None, "e2el_ms": None})
            continue
        share = r.uniform(1.3, 2.0) if i < lost + over else r.uniform(*tpot_range)
        tpot = round(share * promise_ms, 3)
        ttft = round(r.uniform(20, 200), 3)
        requests.append({"ok": True, "ttft_ms": ttft, "tpot_ms": tpot, "e2el_ms": round(ttft + 31 * tpot, 3)})
    r.shuffle(requests)
    return requests


def _queued(r, requests: list[dict], index: int, breaks: int) -> list[dict]:
    """The same requests with TTFT growing with the load, as a queue does: past ``breaks``, seconds."""
    factor = 1.0 + index if index < breaks else 40.0 * (index - breaks + 1)
    return [{**request, "ttft_ms": round(request["ttft_ms"] * factor, 3)} for request in requests]


TTFT_LIMIT_MS = 1000.0  # the TTFT limit of the two-limit situation; a queue of seconds breaks it


def sweep_situations(seed: int) -> dict[str, Any]:
    """The rates, and for each situation its promise and the measurements at every rate."""
    r = rng(seed)
    promise_ms = float(r.choice((50, 80, 120)))
    situations = {}
    for name in SITUATIONS:
        breaks = r.randint(2, 4)  # index of the first rate that breaks the promise
        runs = {}
        for index, rate in enumerate(RATES):
            low = (0.3 + 0.1 * index, 0.5 + 0.1 * index)  # latency grows with the load
            if name == "two limits":  # TPOT keeps its limit everywhere; the queue breaks TTFT's
                runs[rate] = _queued(r, _requests(r, low, promise_ms), index, breaks)
            elif name == "hopeless" or index > breaks or (index == breaks and name == "tail"):
                # at the break: most requests fine (mean and median pass), a tail of 2 over the promise
                runs[rate] = _requests(r, low, promise_ms, over=2 if index == breaks else NUM_REQUESTS)
            elif index == breaks and name == "lost":
                runs[rate] = _requests(r, low, promise_ms, lost=1)
            elif index == breaks and name == "noise":
                runs[rate] = _requests(r, low, promise_ms, over=3)
            else:
                runs[rate] = _requests(r, low, promise_ms)
            if name == "noise" and index == breaks + 1:
                runs[rate] = _requests(r, (0.3, 0.5), promise_ms)  # passes again: noise, not capacity
        promise = {"ttft_ms": TTFT_LIMIT_MS, "tpot_ms": promise_ms} if name == "two limits" else {"tpot_ms": promise_ms}
        situations[name] = {"promise": promise, "runs": runs}
    return {"rates": list(RATES), "situations": situations}


def rates_needed(rates: list[float], best: float | None) -> list[float]:
    """The rates labkit's rule has to measure to sign ``best``: every one up to the first above it (which broke
    the promise), or all of them if none did."""
    ordered = sorted(rates)
    return ordered[: 1 if best is None else ordered.index(best) + 2]


def highest_rate_oracle(runs: dict[float, list[dict]], rates: list[float], promise: dict[str, float]) -> dict[str, Any]:
    """labkit's answer (:func:`labkit.slo.highest_rate`) and the rates it had to measure."""
    best = highest_rate({rate: from_requests(runs[rate]) for rate in rates}, Promise.from_limits(promise))
    return {"rate": best, "measured": rates_needed(rates, best)}


def replay(runs: dict[float, list[dict]], measured: list[float]):
    """A ``measure(rate)`` that hands back the stored run of that rate and notes that it was asked for."""

    def measure(rate: float) -> list[dict]:
        rate = float(rate)
        if rate not in runs:
            raise ValueError(f"measure({rate!r}): this sweep only has the rates {sorted(runs)}")
        measured.append(rate)
        return [dict(request) for request in runs[rate]]

    return measure
