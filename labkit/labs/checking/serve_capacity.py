"""Lab 9's capacity check: the learner's SLO sweep against a real server, judged by the grader's own sweep.

The promise is relative to the machine (a GPU is far faster than two CPU cores): p99 time to
first token within ``TTFT_FACTOR`` times, and p99 time per output token within ``TPOT_FACTOR``
times, what one user alone sees on the same server. The run half (the notebook's kernel) starts
a server, measures that promise there and runs the learner's ``find_capacity(url, rates,
promise)`` against it; the oracle (the grader's own process) starts its own server, measures its
own promise and sweeps with labkit's rule. Two sweeps of a few requests on a shared machine
never agree exactly, so the learner's rate passes within ``TOLERANCE_STEPS`` step of the rate
grid from the grader's: wide enough for noise, narrow enough to catch a sweep that measured the
wrong thing (a limit in the wrong unit, another load, a promise ignored).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from labkit.engine import LLM
from labkit.labs.checking.serve_sweep import keeps_promise, p99
from labkit.labs.checking.shared import course_model
from labkit.serve.background import measure
from labkit.serve.server import ServerThread

RATES = (1.0, 2.0, 4.0, 8.0, 16.0)  # requests per second; each twice the last
LOAD = dict(num_prompts=6, input_len=64, output_len=16)  # what every rate of the sweep sends
SERVER_DIALS = dict(policy="continuous", max_num_seqs=4, max_model_len=512, num_blocks=256)
TTFT_FACTOR, TPOT_FACTOR = 5.0, 3.0  # TPOT: a p99 of six is a maximum, and it moves 2x with noise alone
TOLERANCE_STEPS = 1
METRICS = ("ttft_ms", "tpot_ms")


def alone(url: str, repeats: int = 3) -> dict[str, float]:
    """What one user alone sees: the median TTFT and TPOT of ``repeats`` single requests of the sweep's shape.

    A load of the sweep's shape runs first, unmeasured: the first batches after a start are slow
    (memory is allocated, kernels picked), and would count against the lowest rate.
    """
    measure(url, RATES[-1], **LOAD)
    runs = [measure(url, 8.0, **{**LOAD, "num_prompts": 1})[0] for _ in range(repeats)]
    return {metric: statistics.median(run[metric] for run in runs) for metric in METRICS}


def promise_for(url: str) -> dict[str, float]:
    """The sweep's promise on this server: p99 TTFT and TPOT limits in ms, relative to one user alone."""
    seen = alone(url)
    return {"ttft_ms": round(TTFT_FACTOR * seen["ttft_ms"], 1), "tpot_ms": round(TPOT_FACTOR * seen["tpot_ms"], 1)}


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


def run_capacity(functions, inputs) -> dict[str, Any]:
    """The run half: a fresh server, its promise, and the rate the learner's sweep reports for it."""
    if left_blank(functions[0]):
        raise NotImplementedError
    with ServerThread(server_llm()) as server:
        promise = promise_for(server.url)
        rate = functions[0](server.url, list(inputs["rates"]), dict(promise))
    if rate is not None:
        rate = float(rate) if isinstance(rate, (int, float)) else repr(rate)
    return {"rate": rate, "promise": promise}


def p99s(requests: list[dict]) -> dict[str, float] | None:
    """The p99 TTFT and TPOT of a load test's requests, or None if one was lost."""
    if not all(request["ok"] for request in requests):
        return None
    return {metric: round(p99(requests, metric), 1) for metric in METRICS}


def capacity_oracle(inputs) -> dict[str, Any]:
    """The grader's own sweep: its server, its promise, every rate up to the first that breaks it."""
    rates = sorted(inputs["rates"])
    with ServerThread(server_llm()) as server:
        promise = promise_for(server.url)
        best, measured = None, {}
        for rate in rates:
            requests = measure(server.url, rate, **LOAD)
            measured[str(rate)] = p99s(requests)
            if not keeps_promise(requests, promise):
                break
            best = rate
    return {"rate": best, "promise": promise, "p99": measured, "rates": rates}


def grid_steps(rates: list[float], a: float | None, b: float | None) -> int:
    """How many steps of the grid apart two answers are (None sits one step below the lowest rate)."""
    index = {None: -1, **{rate: i for i, rate in enumerate(rates)}}
    return abs(index[a] - index[b])


def rate_text(rate: float | None) -> str:
    return "None (no rate keeps the promise)" if rate is None else f"{rate:g} req/s"


def describe_promise(promise: dict[str, float]) -> str:
    return ", ".join(f"p99 {metric.removesuffix('_ms').upper()} <= {limit:g} ms" for metric, limit in promise.items())


def describe_sweep(expected: dict[str, Any]) -> str:
    measured = "; ".join(
        f"{float(rate):g} req/s "
        + ("lost a request" if seen is None else f"TTFT {seen['ttft_ms']:g} ms, TPOT {seen['tpot_ms']:g} ms")
        for rate, seen in expected["p99"].items()
    )
    return f"my sweep ({describe_promise(expected['promise'])}) measured p99 {measured}"
