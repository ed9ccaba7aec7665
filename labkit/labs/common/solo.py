"""The grader's half of the engine checks (labs 4 to 11): each request decoded alone, and a batched run judged by it.

A batched run must say, request by request, what the request says decoded alone with the model's dense
cache; the kernel runs the engine with the learner's piece (`engine_runs.py`), and these run in the grader.
"""

from __future__ import annotations

from typing import Any

from labkit.engine.reference import SoloRun, compare_to_solo, solo_greedy
from labkit.grading.result import Mismatch
from labkit.labs.common.engine_runs import CheckRequest
from labkit.labs.common.shared import small_model


def run_failure(run: dict[str, Any], where: str = "") -> Mismatch | None:
    """A Mismatch saying the run stopped with an error, or None if it ran to the end."""
    if run.get("error") is None:
        return None
    return Mismatch(f"{where}the run stopped: {run['error']}")


def solo_runs(requests: list[CheckRequest], model=None) -> list[SoloRun]:
    """Each request decoded alone with the model's dense cache: the oracle for every batched run."""
    model = model or small_model()
    return [solo_greedy(model, r.prompt_ids, r.max_tokens, ignore_eos=True) for r in requests]


def compare_with_solo(solo: list[SoloRun], got: list[list[int]]) -> Mismatch | None:
    """The first request whose batched tokens differ from its solo run (near-ties forgiven)."""
    if not isinstance(got, list) or len(got) != len(solo):
        return Mismatch(f"expected tokens for {len(solo)} requests, got {len(got) if isinstance(got, list) else got!r}")
    for index, (alone, batched) in enumerate(zip(solo, got)):
        problem = compare_to_solo(batched, alone)
        if problem is not None:
            return Mismatch(
                f"request r{index}: {problem}",
                "Batching must not change what a request says. Is every running request given exactly "
                "its missing tokens (num_missing_tokens), and admitted with blocks for them?",
            )
    return None


def solo_oracle(inputs: dict[str, Any]) -> dict[str, Any]:
    """The oracle half shared by the engine checks: solo runs of every request in ``inputs["requests"]``."""
    return {"solo": solo_runs(inputs["requests"])}
