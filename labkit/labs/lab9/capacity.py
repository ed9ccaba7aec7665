"""Lab 9's capacity check: the learner's SLO sweep against a real server, judged on the very measurements it made.

The run half starts a server, measures the promise there (``load.py``) and runs the learner's ``find_capacity``
while labkit's load tester records every load it sends; the comparison applies labkit's rule
(:func:`labkit.slo.highest_rate`) to exactly those measurements. So the verdict never depends on how fast or busy
the machine is: a slow machine moves the learner's measurements and the rule's alike, because they are the same.
The learner's ``find_capacity`` runs with labkit's rule (:func:`course_highest_rate`) in place of their
``highest_rate``, which its own exercise judges: a wrong rule costs that exercise only.

On a live server the right answer and some wrong ones can coincide (a sweep that ignores the promise it is given,
or measures every rate), so the sweep then runs once more on stored measurements (:func:`replayed_loads`), where
the capacity is known and those mistakes show whatever the machine.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

from labkit.engine import LLM
from labkit.grading.result import Mismatch, Note
from labkit.labs.common.shared import course_model, rng
from labkit.labs.lab9.load import LOAD, METRICS, RATES, SERVER_DIALS, promise_for
from labkit.serve import background
from labkit.serve.background import per_request
from labkit.serve.loadtest import api_base, recording
from labkit.serve.server import ServerThread
from labkit.slo import Promise, from_requests, highest_rate, keeps
from labkit.trace import RequestRecord, Trace
from labkit.workloads import Workload

MEASURE_HINT = "Measure each rate with the lab's LOAD, measure(url, rate, **LOAD), and let highest_rate decide."
EXAMPLE_PROMISE = {"ttft_ms": 1000.0, "tpot_ms": 100.0}  # exercise 5's example, which a sweep must not put in
# The replayed sweep: at each rate the p99 TTFT and TPOT (ms) every load of that rate reports. Its promise
# keeps 2 and 4 req/s and breaks at 8 (TTFT); the example promise would sign 16, the TPOT limit alone 8.
REPLAY_PROMISE = {"ttft_ms": 400.0, "tpot_ms": 60.0}
REPLAY_SIGNS = 4.0  # what labkit's rule signs on the replayed sweep under REPLAY_PROMISE
REPLAYED = {2.0: (150.0, 40.0), 4.0: (300.0, 45.0), 8.0: (700.0, 50.0), 16.0: (950.0, 70.0), 32.0: (2500.0, 120.0)}
SPREAD = (0.6, 0.7, 0.8, 0.9, 1.0, 1.0)  # each request's share of the p99, in turn


def capacity_inputs(seed: int) -> dict[str, Any]:
    return {"rates": list(RATES)}


def server_llm() -> LLM:
    return LLM(course_model(), **SERVER_DIALS)


def left_blank(find_capacity) -> bool:
    """Whether the exercise is still as handed out: a first call with no rates to try (and so nothing to
    measure) raises NotImplementedError at once, before a server is started for nothing."""
    try:
        find_capacity("http://127.0.0.1:9", [], {metric: math.inf for metric in METRICS})
    except NotImplementedError:
        return True
    except Exception:  # whatever else it does with no rates is judged by the real run
        return False
    return False


def sent_load(workload: Workload, trace: Trace) -> dict[str, Any]:
    """One load the sweep sent, as plain data: where to, at which rate, its shape, what each request's user saw."""
    return {
        "url": trace.meta["url"],
        "rate": workload.meta.get("rate"),
        "load": {
            "dataset": workload.name,
            "num_prompts": len(workload),
            "input_len": int(max(workload.prompt_lens)),
            "output_len": int(max(workload.output_lens)),
        },
        "requests": per_request(trace),
    }


def replayed_trace(base_url: str, workload: Workload) -> Trace:
    """What labkit's load tester would report for ``workload`` if the server measured as ``REPLAYED`` says."""
    rate = workload.meta.get("rate")
    ttft_ms, tpot_ms = REPLAYED.get(rate, REPLAYED[max(REPLAYED)])
    requests = []
    for index, spec in enumerate(workload):
        share = SPREAD[index % len(SPREAD)]
        first = spec.arrival_time + share * ttft_ms / 1000
        times = [first + k * share * tpot_ms / 1000 for k in range(int(spec.output_len))]
        requests.append(
            RequestRecord(
                spec.request_id,
                spec.arrival_time,
                spec.prompt_len,
                first_scheduled_time=spec.arrival_time,
                token_times=times,
                finish_time=times[-1],
                finish_reason="length",
            )
        )
    return Trace(requests=requests, meta={"url": base_url, "workload": workload.name, **workload.meta})


@contextlib.contextmanager
def replayed_loads() -> Iterator[list[tuple[Workload, Trace]]]:
    """While the block lasts, every load :func:`labkit.serve.background.measure` sends is answered from
    ``REPLAYED`` instead of by the server (the server is still asked its model name), and noted."""
    sent: list[tuple[Workload, Trace]] = []

    async def run_load(base_url: str, workload: Workload, model: str, **options) -> tuple[Trace, list[str]]:
        sent.append((workload, replayed_trace(base_url, workload)))
        return sent[-1][1], []

    real, background.run_load = background.run_load, run_load
    try:
        yield sent
    finally:
        background.run_load = real


def reported(rate: Any) -> float | str | None:
    return None if rate is None else float(rate) if isinstance(rate, (int, float)) else repr(rate)


def replay_sweep(find_capacity, url: str, rates: list[float]) -> dict[str, Any] | None:
    """The learner's sweep on replayed measurements, as the judge reads a sweep; None if it sent some load
    other than through :func:`labkit.serve.background.measure` (that cannot be replayed)."""
    with recording() as live, replayed_loads() as replayed:
        rate = find_capacity(url, list(rates), dict(REPLAY_PROMISE))
    if live:
        return None
    loads = [sent_load(*run) for run in replayed]
    return {"rate": reported(rate), "promise": dict(REPLAY_PROMISE), "url": api_base(url), "loads": loads}


def run_capacity(functions, inputs) -> dict[str, Any]:
    """The run half: a fresh server, its promise, the rate the learner's sweep reports and every load it sent;
    then the same sweep on replayed measurements (see :func:`replayed_loads`)."""
    if left_blank(functions[0]):
        raise NotImplementedError
    with ServerThread(server_llm()) as server:
        promise = promise_for(server.url)
        with recording() as sent:
            rate = functions[0](server.url, list(inputs["rates"]), dict(promise))
        replay = replay_sweep(functions[0], server.url, inputs["rates"])
    loads = [sent_load(*run) for run in sent]
    return {"rate": reported(rate), "promise": promise, "url": api_base(server.url), "loads": loads, "replay": replay}


def capacity_oracle(inputs) -> dict[str, Any]:
    """Nothing to measure: the grid, and the load every rate of the sweep must send."""
    return {"rates": sorted(inputs["rates"]), "load": {"dataset": "random", **LOAD}}


def describe_load(load: dict[str, Any]) -> str:
    return (
        f"{load['num_prompts']} {load['dataset']} requests of {load['input_len']} prompt and "
        f"{load['output_len']} answer tokens"
    )


def load_problem(expected: dict[str, Any], got: dict[str, Any]) -> Mismatch | None:
    """What keeps labkit's rule from judging the loads the sweep sent (None: it can judge them)."""
    loads, rates = got["loads"], expected["rates"]
    if not loads:
        return Mismatch("your find_capacity sent no request to the server: it measured nothing", MEASURE_HINT)
    for load in loads:
        if load["url"] != got["url"]:
            return Mismatch(
                f"your sweep loaded {load['url']}, not the server it was given ({got['url']})",
                "Load the url find_capacity receives: the check started a fresh server for your sweep.",
            )
        if load["load"] != expected["load"]:
            return Mismatch(
                f"at {load['rate']} req/s your sweep sent {describe_load(load['load'])}, another load than the "
                f"lab's LOAD ({describe_load(expected['load'])})",
                MEASURE_HINT,
            )
        if load["rate"] not in rates:
            return Mismatch(f"your sweep measured {load['rate']} req/s, which is not one of the rates ({rates})")
    twice = [rate for rate, count in Counter(load["rate"] for load in loads).items() if count > 1]
    if twice:
        return Mismatch(
            f"your sweep measured {twice[0]:g} req/s more than once: which measurement did your answer use?",
            "Measure each rate once, going up from the lowest, and let highest_rate decide.",
        )
    return None


def describe_measurements(results: dict[float, Any]) -> str:
    return "; ".join(
        f"{rate:g} req/s "
        + ("lost a request" if result.lost else f"TTFT {result.p99_ttft_ms:.0f} ms, TPOT {result.p99_tpot_ms:.1f} ms")
        for rate, result in sorted(results.items())
    )


def rate_text(rate: float | None) -> str:
    return "None (no rate keeps the promise)" if rate is None else f"{rate:g} req/s"


def judge_sweep(expected: dict[str, Any], got: dict[str, Any]) -> Mismatch | Note | None:
    """The learner's rate against labkit's rule on the very loads their sweep sent, live and then replayed."""
    verdict = judge_one_sweep(expected, got)
    if verdict is not None:
        return verdict
    replayed = None if got.get("replay") is None else judge_one_sweep(expected, got["replay"])
    if replayed is not None:
        known = f"{REPLAY_SIGNS:g} req/s under {Promise.from_limits(REPLAY_PROMISE).describe()}"
        return Mismatch(
            "your sweep passed on the live server, but not when labkit's load tester answered it from a stored "
            f"sweep whose capacity is known ({known}): {replayed.difference}",
            replayed.hint,
        )
    best = highest_rate(
        {load["rate"]: from_requests(load["requests"]) for load in got["loads"]}, Promise.from_limits(got["promise"])
    )
    return Note(f"your sweep: {rate_text(got['rate'])}; labkit's rule on the same measurements: {rate_text(best)}")


def judge_one_sweep(expected: dict[str, Any], got: dict[str, Any]) -> Mismatch | None:
    """The learner's rate against labkit's rule on the loads one run of their sweep sent."""
    rates, mine = expected["rates"], got["rate"]
    if mine is not None and mine not in rates:
        return Mismatch(
            f"you reported {mine!r}; report one of the rates you were given ({rates}) or None",
            "Return what highest_rate returns for the sweep: a rate of the grid, or None if none keeps the promise.",
        )
    problem = load_problem(expected, got)
    if problem is not None:
        return problem
    results = {load["rate"]: from_requests(load["requests"]) for load in got["loads"]}
    promise = Promise.from_limits(got["promise"])
    best = highest_rate(results, promise)
    needed = rates_needed(rates, best)
    seen = f"your sweep measured p99 {describe_measurements(results)} (promise: {promise.describe()})"
    missing = [rate for rate in needed if rate not in results]
    if missing:
        return Mismatch(
            f"{seen}, but not {missing[0]:g} req/s: labkit's rule needs every rate up to the first that breaks the "
            "promise, so it cannot sign anything from these measurements",
            "Go up from the lowest rate and measure each one until the promise breaks.",
        )
    if mine != best:
        return Mismatch(
            f"{seen}; on these very measurements labkit's rule signs {rate_text(best)}, you reported "
            f"{rate_text(mine)}: {why_not(rates, results, promise, best, mine)}",
            MEASURE_HINT,
        )
    past = [rate for rate in sorted(results) if rate not in needed]
    if past:
        return Mismatch(
            f"right answer, but {seen}: {past[0]:g} req/s and up were measured after {needed[-1]:g} req/s broke it",
            "Each measurement is minutes of load on a real server: stop at the first rate that breaks the promise.",
        )
    return None


def why_not(rates: list[float], results: dict[float, Any], promise: Promise, best: float | None, mine) -> str:
    """The likely mistake behind a rate that is not the rule's, in words."""
    broke = rates_needed(rates, best)[-1]
    if mine is not None and mine == broke and broke != best:
        return "that is the first rate that broke the promise; sign the highest one that kept it, the one below"
    if promise.ttft_ms is not None and mine == highest_rate(results, Promise(promise.tpot_ms)):
        return "that is what the TPOT limit alone allows; the promise also limits the p99 TTFT, and that broke first"
    if mine is not None and mine == highest_rate(results, Promise.from_limits(EXAMPLE_PROMISE)):
        return (
            f"that is what exercise 5's example promise ({Promise.from_limits(EXAMPLE_PROMISE).describe()}) allows; "
            "judge by the promise find_capacity receives"
        )
    offset = grid_offset(rates, best, mine) or 0
    steps, direction = abs(offset), "above" if offset > 0 else "below"
    return f"yours is {steps} step{'s' if steps > 1 else ''} of the grid {direction}; pass the promise on as it is"


def grid_offset(rates: list[float], want: float | None, mine: float | None) -> int | None:
    """How many rates of the grid ``mine`` is above ``want`` (None counts as one below the lowest; None if
    ``mine`` is not on the grid)."""
    index: dict[float | None, int] = {None: -1, **{rate: i for i, rate in enumerate(sorted(rates))}}
    return None if mine not in index else index[mine] - index[want]


SWEEP_RATES = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
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
        for index, rate in enumerate(SWEEP_RATES):
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
    return {"rates": list(SWEEP_RATES), "situations": situations}


def rates_needed(rates: list[float], best: float | None) -> list[float]:
    """The rates labkit's rule has to measure to sign ``best``: every one up to the first above it (which broke
    the promise), or all of them if none did."""
    ordered = sorted(rates)
    return ordered[: 1 if best is None else ordered.index(best) + 2]


def highest_rate_oracle(runs: dict[float, list[dict]], rates: list[float], promise: dict[str, float]) -> dict[str, Any]:
    """labkit's answer (:func:`labkit.slo.highest_rate`) and the rates it had to measure."""
    best = highest_rate({rate: from_requests(runs[rate]) for rate in rates}, Promise.from_limits(promise))
    return {"rate": best, "measured": rates_needed(rates, best)}


def course_highest_rate(measure, rates: list[float], promise: dict[str, float]) -> float | None:
    """labkit's rule (:func:`labkit.slo.highest_rate`) called as the learner's ``highest_rate`` is: the
    sweep's check runs the learner's ``find_capacity`` on it, so a wrong rule costs its own exercise only."""
    limits, best = Promise.from_limits(promise), None
    for rate in sorted(rates):
        if not keeps(from_requests(measure(rate)), limits):
            break
        best = rate
    return best


def replay(runs: dict[float, list[dict]], measured: list[float]):
    """A ``measure(rate)`` that hands back the stored run of that rate and notes that it was asked for."""

    def measure(rate: float) -> list[dict]:
        rate = float(rate)
        if rate not in runs:
            raise ValueError(f"measure({rate!r}): this sweep only has the rates {sorted(runs)}")
        measured.append(rate)
        return [dict(request) for request in runs[rate]]

    return measure
