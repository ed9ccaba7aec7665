"""Lab 12, beyond one server: a router that finds the cache, a slower tier for evicted blocks, prefill and decode apart.

Part 1's check, ``cache_aware_route`` against labkit's :class:`~labkit.engine.fleet.CacheAware`, is here; parts 2 and 3
are checked in :mod:`~labkit.labs.lab12.tier` and :mod:`~labkit.labs.lab12.handoff` (importing this package registers
all three, in the order the notebook shows them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from labkit.engine.fleet import CacheAware
from labkit.engine.interfaces import ReplicaView
from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.mistakes import named_mistake
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints

Case = tuple[str, tuple[ReplicaView, ...], int]  # (what it tests, the replicas as the router sees them, the bound)


def _most_cached_within(replicas: Sequence[ReplicaView], keep: Callable[[int], bool]) -> int:
    """The most cached (then least loaded, lowest index) of the replicas whose load above the least passes ``keep``
    (the least loaded ones if none does)."""
    least = min(replica.unfinished for replica in replicas)
    allowed = [replica for replica in replicas if keep(replica.unfinished - least)]
    allowed = allowed or [replica for replica in replicas if replica.unfinished == least]
    return max(allowed, key=lambda replica: (replica.cached_tokens, -replica.unfinished, -replica.index)).index


def _lowest_index_when_nothing_cached(replicas: Sequence[ReplicaView], bound: float) -> int:
    if all(replica.cached_tokens == 0 for replica in replicas):
        least = min(replica.unfinished for replica in replicas)
        return next(replica.index for replica in replicas if replica.unfinished - least <= bound)
    return CacheAware(bound).route(None, replicas)


def _ties_to_lowest_index(replicas: Sequence[ReplicaView], bound: float) -> int:
    least = min(replica.unfinished for replica in replicas)
    allowed = [replica for replica in replicas if replica.unfinished - least <= bound]
    return max(allowed, key=lambda replica: (replica.cached_tokens, -replica.index)).index


def _position_among_allowed(replicas: Sequence[ReplicaView], bound: float) -> int:
    least = min(replica.unfinished for replica in replicas)
    allowed = [replica for replica in replicas if replica.unfinished - least <= bound]
    return allowed.index(max(allowed, key=lambda replica: (replica.cached_tokens, -replica.unfinished, -replica.index)))


def _bound_as_a_count(replicas: Sequence[ReplicaView], bound: float) -> int:
    allowed = [replica for replica in replicas if replica.unfinished <= bound]
    if not allowed:
        return min(replicas, key=lambda replica: (replica.unfinished, replica.index)).index
    return max(allowed, key=lambda replica: (replica.cached_tokens, -replica.unfinished, -replica.index)).index


BOUND_HINT = (
    "The load bound is off by one: a replica may be chosen when it has at most max_imbalance more unfinished "
    "requests than the least loaded one (replica.unfinished - least <= max_imbalance), so with a bound of 2 a "
    "replica exactly 2 busier is still allowed and one 3 busier is not."
)

# what the learner is told -> the typical mistake, as a function of (replicas, max_imbalance)
MISTAKES: dict[str, Callable[[Sequence[ReplicaView], float], int]] = {
    "This routes by load alone: it picked the least loaded replica although another within the bound holds more "
    "of the prompt in its cache. Among the replicas within the bound, the most cached tokens win; load only "
    "bounds the choice and breaks ties.": lambda replicas, bound: (
        min(replicas, key=lambda replica: (replica.unfinished, replica.index)).index
    ),
    "This routes by cache alone, with no load bound: it picked the replica with the most cached tokens although "
    "it is more than max_imbalance requests busier than the least loaded one. Leave out every replica with "
    "unfinished - least > max_imbalance before looking at the cache (one hot prefix, a shared system prompt, "
    "would otherwise send every request to one replica).": lambda replicas, bound: CacheAware(math.inf).route(
        None, replicas
    ),
    BOUND_HINT + " (yours left out the replica at the bound)": lambda replicas, bound: _most_cached_within(
        replicas, lambda gap: gap < bound
    ),
    BOUND_HINT + " (yours allowed one more)": lambda replicas, bound: _most_cached_within(
        replicas, lambda gap: gap <= bound + 1
    ),
    "Ties in cached tokens went to the lowest index, not to the least loaded: when two replicas within the bound "
    "hold as much of the prompt, send the request to the one with fewer unfinished requests (then the lowest "
    "index).": _ties_to_lowest_index,
    "When no replica holds any of the prompt (every cached_tokens is 0) there is no cache to follow: a 0 means "
    "nothing cached, not a tie to settle by index. Send the request to the least loaded replica, as a load "
    "balancer would.": _lowest_index_when_nothing_cached,
    "You returned the chosen replica's position in your list of allowed replicas, not its index: once a replica "
    "is left out the two differ. Return replica.index, the number the fleet knows it by.": _position_among_allowed,
    "The bound counts requests above the least loaded replica, not requests in all: allow a replica when "
    "replica.unfinished - least <= max_imbalance, with least = min(r.unfinished for r in replicas). A busy fleet "
    "(every replica past max_imbalance) still has replicas to choose from.": _bound_as_a_count,
}

NOTHING_ALLOWED = (
    "No replica was left to choose from (max() or min() of an empty sequence). The least loaded replica is always "
    "allowed: the bound is relative to it (replica.unfinished - least <= max_imbalance, so with max_imbalance 0 the "
    "least loaded ones stay), and it counts requests above the least, not requests in all."
)


def _nothing_allowed(record: dict[str, Any]) -> str | None:
    """The hint for a router that filtered every replica out before taking the max (a `<` bound at 0, a count)."""
    return NOTHING_ALLOWED if record["error"] == "ValueError" and "empty" in record["message"] else None


def _fleet(loads: Sequence[int], cached: Sequence[int]) -> tuple[ReplicaView, ...]:
    return tuple(ReplicaView(index, load, tokens) for index, (load, tokens) in enumerate(zip(loads, cached)))


def route_cases(seed: int) -> list[Case]:
    """Seeded cases, each built so that one typical mistake answers it wrongly: loads shifted by a seeded
    base, cached tokens in seeded multiples of a 16-token block, and three random fleets."""
    r = rng(seed)
    base, block = r.randint(0, 5), 16 * r.randint(1, 4)

    def fleet(loads: Sequence[int], blocks: Sequence[int]) -> tuple[ReplicaView, ...]:
        return _fleet([base + load for load in loads], [block * n for n in blocks])

    cases: list[Case] = [
        ("the most cached within the bound", fleet([0, 3, 1], [0, 8, 4]), 4),
        ("the most cached is past the bound", fleet([0, 3, 1], [0, 8, 4]), 2),
        ("one replica exactly at the bound", fleet([1, 3, 2], [0, 6, 2]), 2),
        ("a bound of 0", fleet([1, 1, 0, 2], [8, 4, 0, 9]), 0),
        ("two replicas hold as much", fleet([2, 3, 0, 1], [5, 5, 5, 0]), 4),
        ("nothing cached anywhere", _fleet([base + 2, base + 1, base + 3], [0, 0, 0]), 4),
        ("one replica", fleet([7], [3]), 1),
        ("a busy fleet, every replica past the bound in requests", fleet([6, 7, 6], [0, 8, 4]), 2),
    ]
    for index in range(3):
        size = r.randint(3, 6)
        loads = [base + r.randint(0, 6) for _ in range(size)]
        cached = [block * r.choice([0, 0, 1, 2, 5]) for _ in range(size)]
        cases.append((f"random fleet {index + 1}", _fleet(loads, cached), r.randint(0, 3)))
    return cases


def _oracle(cases: list[Case]) -> dict[str, Any]:
    return {
        "right": [CacheAware(bound).route(None, replicas) for _, replicas, bound in cases],
        "wrong": {
            hint: [mistake(replicas, bound) for _, replicas, bound in cases] for hint, mistake in MISTAKES.items()
        },
        "cases": [
            (label, [(v.unfinished, v.cached_tokens) for v in replicas], bound) for label, replicas, bound in cases
        ],
    }


def _describe(case: tuple[str, list[tuple[int, int]], int]) -> str:
    label, views, bound = case
    shown = ", ".join(f"{index}: {load} unfinished, {cached} cached" for index, (load, cached) in enumerate(views))
    return f"{label} (replicas {shown}; max_imbalance {bound})"


def _plain(answer: Any) -> int | str:
    """An index as it is; anything else as words the comparison can show (the grader takes plain data only)."""
    if isinstance(answer, int) and not isinstance(answer, bool):
        return answer
    return f"a {type(answer).__name__}" if isinstance(answer, ReplicaView) else f"{answer!r:.60}"


def _compare(expected: dict[str, Any], got: list[Any]) -> Mismatch | None:
    right = expected["right"]
    if not isinstance(got, list) or len(got) != len(right):
        return Mismatch(f"expected {len(right)} answers, got {got!r:.80}")
    for index, (want, have) in enumerate(zip(right, got)):
        where = _describe(expected["cases"][index])
        if not isinstance(have, int):
            return Mismatch(f"{where}: got {have}", "Return the chosen replica's index (replica.index), an int.")
        if have == want:
            continue
        return Mismatch(f"{where}: expected replica {want}, got {have}", named_mistake(expected["wrong"], got, index))
    return None


register(
    diagnosed(
        Exercise(
            id="lab12.cache_aware",
            functions=("cache_aware_route",),
            answers=("labkit.engine.fleet.CacheAware",),
            make_inputs=route_cases,
            run=lambda functions, cases: [_plain(functions[0](replicas, bound)) for _, replicas, bound in cases],
            oracle=_oracle,
            compare=_compare,
            tested="cache_aware_route on 11 seeded fleets (the cache within the bound, a hot replica past it, one "
            "exactly at it, a bound of 0, ties in cache, nothing cached, one replica, a busy fleet, three random "
            "fleets): the replica labkit's cache-aware router picks",
            hint="Find the least load; keep the replicas at most max_imbalance busier; among them take the most "
            'cached tokens, then the fewest unfinished, then the lowest index. labkit.hint("lab12.cache_aware") '
            "shows more.",
        ),
        known=_nothing_allowed,
    )
)

register_hints(
    "lab12.cache_aware",
    "Two questions, in order: which replicas may take the request at all (the load bound), and which of those "
    "holds the most of its prompt (the cache). Load also settles ties.",
    "least = min(r.unfinished for r in replicas); allowed = [r for r in replicas if r.unfinished - least <= "
    "max_imbalance]. The least loaded replica is always allowed, so allowed is never empty.",
    "return max(allowed, key=lambda r: (r.cached_tokens, -r.unfinished, -r.index)).index: the most cached, "
    "then the least loaded, then the lowest index. With nothing cached anywhere that is the least loaded.",
)

# parts 2 and 3, registered after part 1 so the exercises number as the notebook shows them
from labkit.labs.lab12 import tier  # noqa: E402, F401, I001
from labkit.labs.lab12 import handoff  # noqa: E402, F401
