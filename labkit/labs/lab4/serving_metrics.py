"""Lab 4, the serving metrics against ``labkit.metrics.summarize``, on a trace drawn so that every typical mistake
gives a number apart from the right one and the message can name it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints
from labkit.metrics import summarize
from labkit.trace import RequestRecord, Trace

METRIC_NAMES = ("ttft_ms", "tpot_ms", "itl_ms", "goodput")


def metrics_trace(seed: int) -> Trace:
    """A seeded trace of 12 finished requests (times in seconds): uneven lengths, a few stalls."""
    r = rng(seed)
    requests = []
    for index in range(12):
        arrival = r.uniform(0.0, 2.0)
        first = arrival + r.uniform(0.05, 0.9)
        times = [first]
        gap = r.uniform(0.02, 0.08)
        for _ in range(r.choice([2, 3, 5, 8, 20, 40]) - 1):
            times.append(times[-1] + gap * r.uniform(0.8, 1.2) + (0.4 if r.random() < 0.05 else 0.0))
        requests.append(
            RequestRecord(f"r{index}", arrival, r.randint(5, 60), arrival + 0.01, times, times[-1], 0, "length")
        )
    return Trace(requests=requests)


def metrics_slo(trace: Trace) -> dict[str, float]:
    """Limits (ms) near the medians, so that some requests meet one limit and miss the other."""
    summary = summarize(trace)
    return {"ttft": round(summary.ttft_ms.median, -1), "tpot": round(summary.tpot_ms.median, 1)}


def metrics_expected(trace: Trace, slo: dict[str, float]) -> dict[str, float]:
    """labkit.metrics' own answer: the means in ms, and goodput in requests per second."""
    summary = summarize(trace, slo)
    return {
        "ttft_ms": summary.ttft_ms.mean,
        "tpot_ms": summary.tpot_ms.mean,
        "itl_ms": summary.itl_ms.mean,
        "goodput": summary.goodput,
    }


def metric_mistakes(trace: Trace, slo: dict[str, float]) -> dict[str, dict[str, float]]:
    """For each metric, the values the typical mistakes give: mistake -> value."""
    records = trace.requests
    duration = max(r.finish_time for r in records) - min(r.arrival_time for r in records)
    right = metrics_expected(trace, slo)
    ttft_s = [r.first_token_time - r.arrival_time for r in records]
    tpot_s = [(r.finish_time - r.first_token_time) / (r.output_len - 1) for r in records]
    any_good = sum(t * 1000 <= slo["ttft"] or p * 1000 <= slo["tpot"] for t, p in zip(ttft_s, tpot_s))
    # what the mistakes compute: TPOT over every token, or from the arrival; ITL averaged per request first
    with_first = float(np.mean([(r.finish_time - r.first_token_time) / r.output_len for r in records])) * 1000
    from_arrival = float(np.mean([(r.finish_time - r.arrival_time) / (r.output_len - 1) for r in records])) * 1000
    per_request = float(np.mean([np.mean(np.diff(r.token_times)) for r in records])) * 1000
    every_one = len(records) / duration  # goodput with every request counted as good
    a_count = right["goodput"] * duration  # goodput as a count, not a rate
    unit = "seconds, not milliseconds: multiply by 1000"
    return {
        "ttft_ms": {unit: right["ttft_ms"] / 1000},
        "tpot_ms": {
            unit: right["tpot_ms"] / 1000,
            "TPOT included the first token: count the time after the first token, over the tokens after it "
            "(output_len - 1)": with_first,
            "TPOT included the first token's wait (from the arrival): TPOT starts at the first token": from_arrival,
        },
        "itl_ms": {
            unit: right["itl_ms"] / 1000,
            "ITL was averaged per request, then over requests: ITL is every gap between two tokens, pooled, so "
            "a long answer's gaps count once each": per_request,
        },
        "goodput": {
            "goodput counted requests that missed one SLO limit: a good request meets every limit": any_good / duration,
            "every request counted as good: were seconds compared with limits in milliseconds?": every_one,
            "goodput is good requests per second of the run (first arrival to last finish), not a count": a_count,
        },
    }


def metrics_inputs(seed: int) -> dict[str, Any]:
    """A seeded trace and SLO on which every typical mistake gives a different number than the right one."""
    for attempt in range(100):
        trace = metrics_trace(seed * 100 + attempt)
        slo = metrics_slo(trace)
        right = metrics_expected(trace, slo)
        if all(
            not math.isclose(wrong, right[name], rel_tol=1e-3)
            for name, mistakes in metric_mistakes(trace, slo).items()
            for wrong in mistakes.values()
        ):
            return {"trace": trace, "slo": slo}
    raise RuntimeError(f"no trace for seed {seed} tells every mistake apart")  # never seen: a bug of the check


def _run_metrics(functions, inputs) -> dict[str, Any]:
    got = functions[0](inputs["trace"], dict(inputs["slo"]))
    if not isinstance(got, dict):
        return {"returned": type(got).__name__}
    return {name: float(got[name]) if isinstance(got.get(name), (int, float)) else None for name in METRIC_NAMES}


def _compare_metrics(expected, got) -> Mismatch | None:
    if "returned" in got:
        return Mismatch(f"serving_metrics returned a {got['returned']}, expected a dict with keys {list(METRIC_NAMES)}")
    for name in METRIC_NAMES:
        want, have = expected["values"][name], got[name]
        if have is None:
            return Mismatch(
                f"the result has no number under {name!r}", f"Return a dict with keys {list(METRIC_NAMES)}."
            )
        if math.isclose(have, want, rel_tol=1e-6, abs_tol=1e-9):
            continue
        mistakes = expected["mistakes"][name].items()
        hint = next((mistake for mistake, wrong in mistakes if math.isclose(have, wrong, rel_tol=1e-6)), None)
        return Mismatch(
            f"{name}: expected {want:.4g}, got {have:.4g} (labkit.metrics.summarize on the same trace)", hint
        )
    return None


register(
    diagnosed(
        Exercise(
            id="lab4.serving_metrics",
            functions=("serving_metrics",),
            answers=("labkit.metrics.summarize", "labkit.labs.lab4.metrics_expected"),
            make_inputs=metrics_inputs,
            run=_run_metrics,
            oracle=lambda inputs: {
                "values": metrics_expected(inputs["trace"], inputs["slo"]),
                "mistakes": metric_mistakes(inputs["trace"], inputs["slo"]),
            },
            compare=_compare_metrics,
            tested="serving_metrics(trace, slo) on a seeded trace of 12 requests (2 to 40 tokens, a few stalls) "
            "equals labkit.metrics.summarize on the same trace: mean TTFT, TPOT and ITL in ms, goodput in requests/s",
            hint="TTFT ends at the first token; TPOT and ITL look only at what comes after it; goodput counts "
            'requests that meet every limit. labkit.hint("lab4.serving_metrics") shows more.',
        )
    )
)

register_hints(
    "lab4.serving_metrics",
    "Every request record has arrival_time, token_times (one per output token, in seconds) and finish_time. "
    "TTFT is the wait for the first token; TPOT and ITL describe the tokens after it; goodput is the rate of "
    "requests that kept every promise.",
    "TTFT = first token time - arrival. TPOT of a request = (finish - first token) / (output_len - 1). ITL pools "
    "every gap between consecutive tokens of every request, then takes one mean. Goodput = requests meeting every "
    "SLO limit / (last finish - first arrival). Limits are in ms, the trace in seconds.",
    "np.mean(np.concatenate([np.diff(r.token_times) for r in trace.requests])) * 1000 is the mean ITL in ms; "
    "good = all(measured_ms[name] <= limit for name, limit in slo.items()).",
)
