"""Lab 9, exercise 3: reading ``/metrics`` over a window, as a dashboard does: labkit's reading, seeded scrapes
to read, and the check of the learner's ``dashboard(before_text, after_text)`` against both.

The scrapes come from a real :class:`~labkit.serve.prometheus.ServerMetrics` fed seeded events, so they are exactly
what ``labkit serve`` would expose.
"""

from __future__ import annotations

import math
from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints
from labkit.labs.lab9.scrape import parse_metrics
from labkit.serve.prometheus import FINISH_REASONS, ServerMetrics
from labkit.trace import StepRecord

TTFT = "vllm:time_to_first_token_seconds"
KEYS = ("finished", "generation_tokens", "mean_ttft_s", "p90_ttft_s", "prefix_hit_rate", "running", "kv_usage")


def buckets(samples: dict[str, float], name: str) -> list[tuple[float, float]]:
    """A histogram's (upper edge, cumulative count) pairs in order, +Inf last."""
    prefix = f'{name}_bucket{{le="'
    pairs = [(float(key[len(prefix) : -2]), value) for key, value in samples.items() if key.startswith(prefix)]
    return sorted(pairs)


def histogram_quantile(q: float, edges_and_counts: list[tuple[float, float]]) -> float:
    """Prometheus' estimate of the q-quantile from cumulative buckets: linear inside the bucket holding the rank."""
    total = edges_and_counts[-1][1] if edges_and_counts else 0.0
    if total <= 0:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for edge, cumulative in edges_and_counts:
        if cumulative >= rank:
            if math.isinf(edge):  # the rank is past the last finite edge: that edge is all we know
                return lower
            return lower + (edge - lower) * (rank - below) / (cumulative - below)
        lower, below = edge, cumulative
    return lower


def window(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counters and histogram samples as increases over the window (a series new in ``after`` started at 0)."""
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def read_dashboard(before_text: str, after_text: str) -> dict[str, float]:
    """labkit's reading of the window between two scrapes: the numbers of a serving dashboard."""
    before, after = parse_metrics(before_text), parse_metrics(after_text)
    grew = window(before, after)
    queries = grew["vllm:prefix_cache_queries_total"]
    return {
        "finished": sum(grew[f'vllm:request_success_total{{finished_reason="{r}"}}'] for r in FINISH_REASONS),
        "generation_tokens": grew["vllm:generation_tokens_total"],
        "mean_ttft_s": grew[f"{TTFT}_sum"] / grew[f"{TTFT}_count"],
        "p90_ttft_s": histogram_quantile(0.9, buckets(grew, TTFT)),
        "prefix_hit_rate": grew["vllm:prefix_cache_hits_total"] / queries if queries else math.nan,
        "running": after["vllm:num_requests_running"],
        "kv_usage": after["vllm:kv_cache_usage_perc"],
    }


def typical_misreadings(before_text: str, after_text: str) -> dict[str, list[tuple[float, str]]]:
    """For each number, the values the usual mistakes give, each with what the mistake is."""
    before, after = parse_metrics(before_text), parse_metrics(after_text)
    grew = window(before, after)
    right = read_dashboard(before_text, after_text)
    totals = read_dashboard("", after_text)  # the scrape read as if the server had started with the window
    ttft = buckets(grew, TTFT)
    upper_edge = next(edge for edge, count in ttft if count >= 0.9 * ttft[-1][1])
    per_bucket = [(edge, count - (ttft[i - 1][1] if i else 0.0)) for i, (edge, count) in enumerate(ttft)]
    since_start = (
        "that is the total since the server started; a panel shows the increase over the window (after - before)"
    )
    wrong: dict[str, list[tuple[float, str]]] = {key: [(totals[key], since_start)] for key in KEYS[:5]}
    wrong["finished"].append(
        (
            grew['vllm:request_success_total{finished_reason="stop"}'],
            'you counted only finished_reason="stop"; requests also finish by length and by abort',
        )
    )
    wrong["p90_ttft_s"] += [
        (
            upper_edge,
            "that is the upper edge of the bucket holding the 90th percentile; Prometheus interpolates "
            "linearly inside it (histogram_quantile)",
        ),
        (
            histogram_quantile(0.9, per_bucket) if per_bucket[-1][1] > 0 else math.nan,
            "bucket counts are cumulative (le = less or equal): each already includes the buckets below it",
        ),
        (right["mean_ttft_s"], "that is the mean, not the 90th percentile"),
    ]
    wrong["prefix_hit_rate"].append(
        (
            grew["vllm:prefix_cache_hits_total"] / grew["vllm:prompt_tokens_total"],
            "divide by vllm:prefix_cache_queries (tokens looked up, preempted requests again), not by prompt tokens",
        )
    )
    for key, name in (("running", "vllm:num_requests_running"), ("kv_usage", "vllm:kv_cache_usage_perc")):
        wrong[key] = [
            (grew[name], "a gauge is a reading of now: take its value in the last scrape, do not subtract"),
            (before[name], "take the gauge from the later scrape (after), not the earlier one"),
        ]
    return wrong


def step_record(running: int, waiting: int, kv: float, preempted: int, queries: int = 0, hits: int = 0) -> StepRecord:
    """A made-up engine step with these queue lengths, KV usage (of 1,000 blocks) and prefix-cache counts."""
    return StepRecord(
        index=0,
        start=0.0,
        end=0.0,
        scheduled={f"r{index}": 1 for index in range(running)},
        num_prefill_tokens=0,
        num_decode_tokens=running,
        slots_held=running,
        num_waiting=waiting,
        blocks_used=round(kv * 1000),
        blocks_total=1000,
        preempted=[f"p{index}" for index in range(preempted)],
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
    )


def seeded_scrapes(seed: int) -> tuple[str, str]:
    """Two scrapes of a server that served seeded traffic, the second some requests after the first."""
    r = rng(seed)
    metrics = ServerMetrics("lab9-check")

    def traffic(num_requests: int, running: int, waiting: int, kv: float) -> None:
        for _ in range(num_requests):
            prompt, answer = r.randint(20, 400), r.randint(4, 60)
            looked_up = prompt + r.choice((0, 0, r.randint(10, prompt)))  # a preempted request is looked up again
            metrics.on_step(
                step_record(
                    r.randint(1, 8), r.randint(0, 5), r.random(), int(r.random() < 0.2), looked_up, r.randint(0, prompt)
                )
            )
            metrics.on_tokens(prompt, 1, r.choice((r.uniform(0.03, 0.3), r.uniform(0.3, 2.4))), [])
            metrics.on_tokens(prompt, answer - 1, None, [r.uniform(0.02, 0.09) for _ in range(answer - 1)])
            reason = r.choice(("stop", "stop", "length", "abort"))
            metrics.on_finish(reason, r.uniform(0.5, 6.0), r.uniform(0.0, 0.5))
        metrics.on_step(step_record(running, waiting, kv, 0))

    traffic(r.randint(15, 30), r.randint(1, 8), r.randint(0, 4), round(r.uniform(0.1, 0.9), 3))
    before = metrics.render().decode()
    traffic(r.randint(20, 40), r.randint(1, 8), r.randint(0, 4), round(r.uniform(0.1, 0.9), 3))
    return before, metrics.render().decode()


def close(a: Any, b: float) -> bool:
    """Equal up to rounding (both NaN counts as equal)."""
    if not isinstance(a, (int, float)) or isinstance(a, bool):
        return False
    if math.isnan(b) or math.isnan(a):
        return math.isnan(b) and math.isnan(a)
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def _scrapes(seed: int) -> dict[str, str]:
    before, after = seeded_scrapes(seed)
    return {"before": before, "after": after}


def _run_dashboard(functions, inputs) -> Any:
    return functions[0](inputs["before"], inputs["after"])


def _dashboard_oracle(inputs) -> dict[str, Any]:
    return {
        "right": read_dashboard(inputs["before"], inputs["after"]),
        "wrong": typical_misreadings(inputs["before"], inputs["after"]),
    }


def _compare_dashboard(expected, got) -> Mismatch | None:
    if not isinstance(got, dict):
        return Mismatch(f"dashboard returned a {type(got).__name__}; return a dict with the keys {list(KEYS)}")
    missing = [key for key in KEYS if key not in got]
    if missing:
        return Mismatch(f"the dict lacks {missing}; it needs {list(KEYS)}")
    for key in KEYS:
        right, value = expected["right"][key], got[key]
        if close(value, right):
            continue
        for wrong, why in expected["wrong"].get(key, []):
            if close(value, wrong) and not close(wrong, right):
                return Mismatch(f"{key} = {value:.6g}, expected {right:.6g}: {why}")
        shown = f"{value:.6g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)
        return Mismatch(f"{key} = {shown}, expected {right:.6g} (labkit's reading of the same two scrapes)")
    return None


register(
    diagnosed(
        Exercise(
            id="lab9.dashboard",
            functions=("dashboard",),
            answers=("labkit.labs.lab9.dashboard.read_dashboard",),
            make_inputs=_scrapes,
            run=_run_dashboard,
            oracle=_dashboard_oracle,
            compare=_compare_dashboard,
            tested="two /metrics scrapes of a server that served seeded traffic: finished requests, generation "
            "tokens, mean and p90 TTFT, prefix-cache hit rate over the window, and the running and KV-usage "
            "gauges, each equal to labkit's own reading",
            hint="Counters and histograms: after minus before. Gauges: the after scrape. p90: Prometheus' "
            "histogram_quantile over the window's cumulative buckets.",
            points=2.0,
        )
    )
)

register_hints(
    "lab9.dashboard",
    "A scrape is a snapshot since the server started. A dashboard shows a window: for counters and histograms "
    "the increase between two scrapes; for gauges (running, KV usage) the value now.",
    "Parse both texts with parse_metrics. finished = the increase of vllm:request_success_total summed over its "
    "finished_reason labels; mean TTFT = increase of _sum over increase of _count; hit rate = increase of "
    "prefix_cache_hits over increase of prefix_cache_queries.",
    "p90: take the window's bucket counts (after - before, each le), sorted by le; rank = 0.9 * the +Inf count; "
    "find the first bucket whose count >= rank and interpolate between its lower and upper edge: "
    "lower + (upper - lower) * (rank - count_below) / (count - count_below).",
)
