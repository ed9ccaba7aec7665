"""Lab 12's check: labkit's cache-aware router passes, and each typical wrong router fails with its mistake named.

The wrong answers are written here as a learner would write them (not taken from the check's own table of
mistakes), so a check that stopped telling them apart would fail. The replay helper's table is checked on a
tiny model: one row per policy, the requests of every row add up to the replay's.
"""

from __future__ import annotations

import math

import pytest

from labkit.engine.fleet import CacheAware
from labkit.grading import evaluate
from labkit.grading.result import NOT_DONE
from labkit.labs import lab12
from labkit.labs.hints import tiers
from labkit.labs.lab12 import replay

pytestmark = [pytest.mark.lab12]


def right(replicas, max_imbalance):
    least = min(r.unfinished for r in replicas)
    allowed = [r for r in replicas if r.unfinished - least <= max_imbalance]
    return max(allowed, key=lambda r: (r.cached_tokens, -r.unfinished, -r.index)).index


def by_load_alone(replicas, max_imbalance):
    return min(replicas, key=lambda r: (r.unfinished, r.index)).index


def by_cache_alone(replicas, max_imbalance):
    return max(replicas, key=lambda r: (r.cached_tokens, -r.unfinished, -r.index)).index


def bound_strict(replicas, max_imbalance):
    least = min(r.unfinished for r in replicas)
    allowed = [r for r in replicas if r.unfinished - least < max_imbalance] or [
        r for r in replicas if r.unfinished == least
    ]
    return max(allowed, key=lambda r: (r.cached_tokens, -r.unfinished, -r.index)).index


def bound_one_loose(replicas, max_imbalance):
    least = min(r.unfinished for r in replicas)
    allowed = [r for r in replicas if r.unfinished <= least + max_imbalance + 1]
    return max(allowed, key=lambda r: (r.cached_tokens, -r.unfinished, -r.index)).index


def ties_by_index(replicas, max_imbalance):
    least = min(r.unfinished for r in replicas)
    best = None
    for r in replicas:
        if r.unfinished - least <= max_imbalance and (best is None or r.cached_tokens > best.cached_tokens):
            best = r
    return best.index


def zero_is_a_tie(replicas, max_imbalance):
    least = min(r.unfinished for r in replicas)
    allowed = [r for r in replicas if r.unfinished - least <= max_imbalance]
    most = max(r.cached_tokens for r in allowed)
    if most == 0:
        return allowed[0].index
    return min((r for r in allowed if r.cached_tokens == most), key=lambda r: r.unfinished).index


def position_among_allowed(replicas, max_imbalance):
    least = min(r.unfinished for r in replicas)
    allowed = [r for r in replicas if r.unfinished - least <= max_imbalance]
    scores = [(r.cached_tokens, -r.unfinished, -r.index) for r in allowed]
    return scores.index(max(scores))


def bound_as_a_count(replicas, max_imbalance):
    allowed = [r for r in replicas if r.unfinished <= max_imbalance]
    return max(allowed, key=lambda r: (r.cached_tokens, -r.unfinished, -r.index)).index


def strict_bound_that_crashes_at_zero(replicas, max_imbalance):
    least = min(r.unfinished for r in replicas)
    allowed = [r for r in replicas if r.unfinished - least < max_imbalance]
    return max(allowed, key=lambda r: (r.cached_tokens, -r.unfinished, -r.index)).index


def returns_the_view(replicas, max_imbalance):
    return replicas[right(replicas, max_imbalance)]


def unfinished(replicas, max_imbalance):
    raise NotImplementedError("write cache_aware_route")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_right_router_passes(seed):
    result = evaluate("lab12.cache_aware", right, seed=seed)
    assert result.passed, result.message


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (by_load_alone, "routes by load alone"),
        (by_cache_alone, "routes by cache alone, with no load bound"),
        (bound_strict, "left out the replica at the bound"),
        (bound_one_loose, "allowed one more"),
        (ties_by_index, "Ties in cached tokens went to the lowest index"),
        (zero_is_a_tie, "a 0 means nothing cached"),
        (returns_the_view, "Return the chosen replica's index"),
        (position_among_allowed, "position in your list of allowed replicas"),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
@pytest.mark.parametrize("seed", [0, 3])
def test_a_typical_wrong_router_fails_with_its_mistake_named(answer, words, seed):
    result = evaluate("lab12.cache_aware", answer, seed=seed)
    assert not result.passed and words in result.message, result.message
    assert "expected replica" in result.message or "got a ReplicaView" in result.message  # the first difference


@pytest.mark.parametrize("answer", [bound_as_a_count, strict_bound_that_crashes_at_zero])
@pytest.mark.parametrize("seed", [0, 3, 8])
def test_a_router_that_leaves_no_replica_is_told_the_bound_is_relative(answer, seed):
    """Counting requests in all, or `<` at a bound of 0, filters every replica out: max() of nothing raises."""
    result = evaluate("lab12.cache_aware", answer, seed=seed)
    assert not result.passed and "No replica was left to choose from" in result.message, result.message
    assert answer.__name__ in result.message  # pointed at the learner's own line


def test_a_router_that_raises_is_pointed_at_its_line_and_an_unwritten_one_is_not_done():
    def crashes(replicas, max_imbalance):
        return max(replicas, key=lambda r: r.cached).index

    result = evaluate("lab12.cache_aware", crashes)
    assert not result.passed and "AttributeError" in result.message and "crashes" in result.message
    assert evaluate("lab12.cache_aware", unfinished).status == NOT_DONE


@pytest.mark.parametrize("seed", range(12))
def test_every_typical_mistake_is_caught_on_every_seed_and_the_cases_answer_as_labkit_does(seed):
    cases = lab12.route_cases(seed)
    expected = [CacheAware(bound).route(None, replicas) for _, replicas, bound in cases]
    assert [right(replicas, bound) for _, replicas, bound in cases] == expected
    for mistake in lab12.MISTAKES.values():
        assert [mistake(replicas, bound) for _, replicas, bound in cases] != expected
    assert all(v.index == i for _, replicas, _ in cases for i, v in enumerate(replicas))  # as the fleet numbers them


def test_the_exercise_has_hints_in_tiers():
    assert len(tiers("lab12.cache_aware")) >= 2


def test_the_replay_table_has_a_row_per_policy_and_serves_every_request_once(capsys):
    from dataclasses import replace

    from labkit.models import tiny_model
    from labkit.workloads import replay_workload

    model = tiny_model("llama", seed=3)
    shared = list(range(2, 50))  # three blocks every prompt starts with
    prompts = [shared + [60 + i] * 20 for i in range(5)]
    timing = replay_workload([0.1 * i for i in range(5)], [len(p) for p in prompts], [3] * 5)
    workload = replace(timing, requests=tuple(replace(spec, prompt=p) for spec, p in zip(timing, prompts)))
    routers = replay.routing_policies(right)
    table = replay.PolicyTable(model, workload, routers, served_before=shared + [7])
    for name in routers:  # one policy a cell, as the notebook runs them: each prints the table so far
        table.run(name)
    rows = table.rows
    assert [row.policy for row in rows] == list(routers) and all(sum(row.served) == 5 for row in rows)
    assert rows[2].served == (5, 0)  # the cache alone: replica 0 served the shop's chat before, so it gets all
    assert all(0 < row.hit_rate < 1 and math.isfinite(row.ttft_p99_ms) and row.prefill_tokens > 0 for row in rows)
    assert str(rows[2]).split()[:3] == ["cache", "only", "(no"] and "5 / 0" in str(rows[2])
    assert capsys.readouterr().out.count(replay.HEADER) == len(routers)
    older = replay.compare_policies(
        model, workload, routers, served_before=shared + [7]
    )  # the one-call form notebooks handed out earlier use
    assert [row.policy for row in older] == list(routers) and all(sum(row.served) == 5 for row in older)
    with pytest.raises(KeyError, match="its policies are round robin, least loaded"):
        table.add("random")
