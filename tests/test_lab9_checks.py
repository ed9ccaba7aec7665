"""Lab 9's checks: each passes the right answer and fails each typical mistake, naming it.

The engine loop is driven with scripted clients on the tiny model, the dashboard is read from
scrapes of a real ServerMetrics, the SLO search replays stored load tests: nothing here opens
a socket, so the checks need no network (the notebook's demo cells do, on loopback).
"""

import math

import numpy as np
import pytest

from labkit.grading.feedback import evaluate
from labkit.grading.result import FAIL, PASS
from labkit.labs.lab9.capacity import highest_rate_oracle, sweep_situations
from labkit.labs.lab9.dashboard import (
    buckets,
    histogram_quantile,
    parse_metrics,
    read_dashboard,
    seeded_scrapes,
    window,
)

pytestmark = pytest.mark.lab9


def verdict(exercise_id: str, function, seed: int = 0) -> str:
    result = evaluate(exercise_id, function, seed=seed)
    return f"{result.status}: {result.message}"


# --- lab9.engine_turn ----------------------------------------------------------------------------
def engine_turn(llm, inbox, send):
    while inbox:
        kind, request_id, *rest = inbox.pop(0)
        if kind == "add":
            prompt_ids, params = rest
            llm.add_request(prompt_ids, params, request_id=request_id)
        else:
            llm.abort_request(request_id)
    if llm.has_unfinished():
        for output in llm.step():
            send(output)


def step_first(llm, inbox, send):
    if llm.has_unfinished():
        for output in llm.step():
            send(output)
    while inbox:
        kind, request_id, *rest = inbox.pop(0)
        if kind == "add":
            llm.add_request(rest[0], rest[1], request_id=request_id)
        else:
            llm.abort_request(request_id)


def ignores_aborts(llm, inbox, send):
    inbox[:] = [command for command in inbox if command[0] == "add"]
    engine_turn(llm, inbox, send)


def sends_only_finished(llm, inbox, send):
    engine_turn(llm, inbox, lambda output: send(output) if output.finished else None)


def runs_to_the_end(llm, inbox, send):
    engine_turn(llm, inbox, send)
    while llm.has_unfinished():
        for output in llm.step():
            send(output)


def newest_first(llm, inbox, send):
    while inbox:
        kind, request_id, *rest = inbox.pop()
        if kind == "add":
            llm.add_request(rest[0], rest[1], request_id=request_id)
        else:
            llm.abort_request(request_id)
    if llm.has_unfinished():
        for output in llm.step():
            send(output)


def aborts_first(llm, inbox, send):
    inbox.sort(key=lambda command: command[0] != "abort")
    engine_turn(llm, inbox, send)


def adds_first(llm, inbox, send):
    """Harmless: an add and an abort of different requests commute; the order among adds is kept."""
    inbox.sort(key=lambda command: command[0] != "add")
    engine_turn(llm, inbox, send)


def leaves_the_inbox(llm, inbox, send):
    for kind, request_id, *rest in list(inbox):
        if kind == "add":
            llm.add_request(rest[0], rest[1], request_id=request_id)
    engine_turn(llm, [], send)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_engine_loop_passes(seed):
    assert verdict("lab9.engine_turn", engine_turn, seed).startswith(PASS)


def test_commands_that_commute_may_be_reordered():
    assert verdict("lab9.engine_turn", adds_first).startswith(PASS)


@pytest.mark.parametrize(
    "wrong, named",
    [
        (step_first, "joins the very next step"),
        (ignores_aborts, "llm.abort_request"),
        (sends_only_finished, "only when it finished"),
        (runs_to_the_end, "One step per turn"),
        (leaves_the_inbox, "applied twice"),
        (newest_first, "in the order they arrived (oldest first)"),
        (aborts_first, "applied the abort (hang-up) of client6 first"),
    ],
    ids=[
        "steps-before-commands",
        "ignores-aborts",
        "sends-only-finished",
        "runs-to-the-end",
        "leaves-the-inbox",
        "newest-first",
        "aborts-before-adds",
    ],
)
def test_each_loop_mistake_fails_and_is_named(wrong, named):
    result = verdict("lab9.engine_turn", wrong)
    assert result.startswith(FAIL) and named in result, result


# --- lab9.dashboard --------------------------------------------------------------------------------
def dashboard(before_text, after_text, *, totals=False, only_stop=False, upper_edge=False, per_prompt=False):
    before, after = parse_metrics("" if totals else before_text), parse_metrics(after_text)
    grew = {key: value - before.get(key, 0.0) for key, value in after.items()}
    ttft = "vllm:time_to_first_token_seconds"
    edges = sorted(
        (float(key.split('le="')[1][:-2]), value) for key, value in grew.items() if key.startswith(ttft + "_bucket")
    )
    rank = 0.9 * edges[-1][1]
    lower, below = 0.0, 0.0
    for edge, count in edges:
        if count >= rank:
            p90 = edge if upper_edge else lower + (edge - lower) * (rank - below) / (count - below)
            break
        lower, below = edge, count
    reasons = ["stop"] if only_stop else ["stop", "length", "abort"]
    looked_up = grew["vllm:prompt_tokens_total" if per_prompt else "vllm:prefix_cache_queries_total"]
    return {
        "finished": sum(grew[f'vllm:request_success_total{{finished_reason="{r}"}}'] for r in reasons),
        "generation_tokens": grew["vllm:generation_tokens_total"],
        "mean_ttft_s": grew[ttft + "_sum"] / grew[ttft + "_count"],
        "p90_ttft_s": p90,
        "prefix_hit_rate": grew["vllm:prefix_cache_hits_total"] / looked_up,
        "running": after["vllm:num_requests_running"],
        "kv_usage": after["vllm:kv_cache_usage_perc"],
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_dashboard_passes(seed):
    assert verdict("lab9.dashboard", dashboard, seed).startswith(PASS)


def subtracts_gauges(before_text, after_text):
    read = dashboard(before_text, after_text)
    read["running"] -= parse_metrics(before_text)["vllm:num_requests_running"]
    return read


@pytest.mark.parametrize(
    "wrong, named",
    [
        (lambda b, a: dashboard(b, a, totals=True), "total since the server started"),
        (lambda b, a: dashboard(b, a, only_stop=True), 'only finished_reason="stop"'),
        (lambda b, a: dashboard(b, a, upper_edge=True), "upper edge"),
        (lambda b, a: dashboard(b, a, per_prompt=True), "not by prompt tokens"),
        (subtracts_gauges, "a gauge is a reading of now"),
        (lambda b, a: {"finished": 1}, "lacks"),
    ],
    ids=["totals", "only-stop", "upper-edge", "hit-rate-over-prompt-tokens", "subtracted-gauge", "missing-keys"],
)
def test_each_dashboard_mistake_fails_and_is_named(wrong, named):
    result = verdict("lab9.dashboard", wrong)
    assert result.startswith(FAIL) and named in result, result


def test_labkits_quantile_is_prometheus_interpolation():
    assert histogram_quantile(0.5, [(1.0, 0.0), (2.0, 10.0), (math.inf, 10.0)]) == 1.5
    assert histogram_quantile(0.9, [(1.0, 5.0), (math.inf, 10.0)]) == 1.0  # past the last finite edge
    assert math.isnan(histogram_quantile(0.9, [(1.0, 0.0), (math.inf, 0.0)]))
    before, after = seeded_scrapes(3)
    grew = window(parse_metrics(before), parse_metrics(after))
    counts = [count for _, count in buckets(grew, "vllm:time_to_first_token_seconds")]
    assert counts == sorted(counts) and counts[-1] == grew["vllm:time_to_first_token_seconds_count"] > 0
    read = read_dashboard(before, after)
    assert 0 < read["prefix_hit_rate"] < 1 and read["finished"] > 0


# --- lab9.highest_rate -----------------------------------------------------------------------------
def breaks(requests, promise, statistic=lambda values: np.percentile(values, 99)):
    return any(statistic([r[metric] for r in requests]) > limit for metric, limit in promise.items())


def highest_rate(measure, rates, promise):
    best = None
    for rate in sorted(rates):
        requests = measure(rate)
        if not all(r["ok"] for r in requests) or breaks(requests, promise):
            break
        best = rate
    return best


def with_mean(measure, rates, promise):
    best = None
    for rate in rates:
        requests = measure(rate)
        if not all(r["ok"] for r in requests) or breaks(requests, promise, np.mean):
            break
        best = rate
    return best


def ignoring_lost(measure, rates, promise):
    best = None
    for rate in rates:
        if breaks([r for r in measure(rate) if r["ok"]], promise):
            break
        best = rate
    return best


def max_of_passing(measure, rates, promise):
    kept = []
    for rate in rates:
        requests = measure(rate)
        if all(r["ok"] for r in requests) and not breaks(requests, promise):
            kept.append(rate)
    return max(kept, default=None)


def measures_everything(measure, rates, promise):
    runs = {rate: measure(rate) for rate in rates}
    return highest_rate(lambda rate: runs[rate], rates, promise)


def percentile_of_everything(measure, rates, promise):
    best = None
    for rate in rates:
        if breaks(measure(rate), promise):
            break
        best = rate
    return best


def none_is_zero(measure, rates, promise):
    best = highest_rate(measure, rates, promise)
    return 0.0 if best is None else best


def only_tpot(measure, rates, promise):
    return highest_rate(measure, rates, {"tpot_ms": promise["tpot_ms"]})


def first_broken(measure, rates, promise):
    for rate in sorted(rates):
        requests = measure(rate)
        if not all(r["ok"] for r in requests) or breaks(requests, promise):
            return rate
    return max(rates)


def one_too_soon(measure, rates, promise):
    """Two below the first rate that broke: the rate remembered before the last one that passed."""
    best = before = None
    for rate in sorted(rates):
        requests = measure(rate)
        if not all(r["ok"] for r in requests) or breaks(requests, promise):
            break
        before, best = best, rate
    return before


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_search_passes(seed):
    assert verdict("lab9.highest_rate", highest_rate, seed).startswith(PASS)


@pytest.mark.parametrize(
    "wrong, named",
    [
        (with_mean, "hides the slowest 1%"),
        (ignoring_lost, "request was lost"),
        (max_of_passing, "noise, not capacity"),
        (measures_everything, "was enough"),
        (none_is_zero, "return None"),
        (percentile_of_everything, "A lost request has ok False"),
        (only_tpot, "check every metric of the promise"),
        (first_broken, "you return the first rate that broke the promise"),
        (one_too_soon, "an off-by-one in the search; you return a rate below the last that kept"),
    ],
    ids=[
        "mean",
        "ignores-lost",
        "max-of-passing",
        "measures-everything",
        "zero-for-none",
        "percentile-of-none",
        "only-tpot",
        "first-broken-rate",
        "one-below",
    ],
)
def test_each_search_mistake_fails_and_is_named(wrong, named):
    result = verdict("lab9.highest_rate", wrong)
    assert result.startswith(FAIL) and named in result, result


def test_the_situations_each_teach_one_thing():
    """The replayed runs really tell the mistakes apart (else a check could not name them)."""
    inputs = sweep_situations(5)
    rates = inputs["rates"]
    for name, situation in inputs["situations"].items():
        runs, promise = situation["runs"], situation["promise"]
        right = highest_rate_oracle(runs, rates, promise)["rate"]
        measure = runs.__getitem__
        if name == "tail":
            assert with_mean(measure, rates, promise) != right
        if name == "lost":
            assert ignoring_lost(measure, rates, promise) != right
        if name == "noise":
            assert max_of_passing(measure, rates, promise) != right
        if name == "hopeless":
            assert right is None
        if name == "two limits":
            assert only_tpot(measure, rates, promise) != right and right is not None
