"""Lab 8, what the greedy and rollback checks share: the course model serving seeded repetitive texts with the
learner's piece in the engine, judged against each request decoded alone and the engine's own counts."""

from __future__ import annotations

import functools
from typing import Any

from labkit.grading.result import Mismatch
from labkit.labs.common.engine_runs import CheckRequest
from labkit.labs.common.solo import compare_with_solo, run_failure
from labkit.labs.lab8.runs import repetitive_requests, serve_speculating, solo_course_runs

GREEDY_K = 3


def engine_requests(seed: int) -> list[CheckRequest]:
    return repetitive_requests(seed, 3)


@functools.lru_cache(maxsize=2)
def engine_oracle(seed: int) -> dict[str, Any]:
    """The engine's own run of a seed's requests and their solo runs: shared by the greedy and rollback checks
    (and by the gates of demo cells, which ask again), so the course model decodes them once per process."""
    requests = engine_requests(seed)
    return {"engine": serve_speculating(requests, GREEDY_K, watch_blocks=True), "solo": solo_course_runs(requests)}


def with_engine_requests(cases: Any, seed: int) -> dict[str, Any]:
    """A check's inputs: its own cases, then the seed's requests for the engine and the seed (for the oracle)."""
    return {"cases": cases, "requests": engine_requests(seed), "seed": seed}


def compare_engine_run(expected, run, whose: str) -> Mismatch | None:
    """The engine run with the learner's piece: it ran, its tokens are the solo ones, its counts the engine's."""
    where = f"in the engine with {whose} (k = {GREEDY_K}, greedy)"
    failure = run_failure(run, f"{where}, ")
    if failure is not None:
        return failure
    mismatch = compare_with_solo(expected["solo"], run["tokens"])
    if mismatch is not None:
        return Mismatch(
            f"{where}, {mismatch.difference}",
            "Speculation must never change a greedy answer: every token kept must be the target's own argmax.",
        )
    for key, what in (("num_draft_tokens", "draft tokens"), ("num_accepted_tokens", "accepted drafts")):
        if run[key] != expected["engine"][key]:
            return Mismatch(
                f"{where}: {run[key]} {what}, the engine's own rule gives {expected['engine'][key]}",
                "The answers are right but the counts differ: accept exactly the drafts that agree, up to the first "
                "that does not, and count the bonus token as the target's, not as an accepted draft.",
            )
    return None
