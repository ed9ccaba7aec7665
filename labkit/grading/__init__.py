"""Grading: in-notebook checks with instant feedback, and the `labkit grade` autograder.

- `check("lab2.decode_with_cache", fn)` shows PASS/FAIL with the first difference and a hint.
- `checks` is the registry of exercise specs; `compare` holds the comparison helpers.
- `labkit make-labs` turns solved lab sources into learner notebooks; `labkit grade`
  runs each submission in a sandboxed kernel and judges it in limited child processes.
See README.md in this folder for the instructor's view.

The names below are imported on first use: the grader's agent in a learner's kernel imports modules of
this package, and must not pull in torch (through `compare`) where the learner's code never needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for mypy and readers: what each name is (`X as X`: re-exported)
    from labkit.grading.checks import Exercise as Exercise
    from labkit.grading.checks import exercises_for_lab as exercises_for_lab
    from labkit.grading.checks import get_exercise as get_exercise
    from labkit.grading.checks import register as register
    from labkit.grading.compare import compare_sequences as compare_sequences
    from labkit.grading.compare import compare_tensors as compare_tensors
    from labkit.grading.compare import compare_tokens as compare_tokens
    from labkit.grading.feedback import check as check
    from labkit.grading.feedback import evaluate as evaluate
    from labkit.grading.result import CheckResult as CheckResult
    from labkit.grading.result import Mismatch as Mismatch

_HOMES = {
    "CheckResult": "result",
    "Exercise": "checks",
    "Mismatch": "result",
    "check": "feedback",
    "compare_sequences": "compare",
    "compare_tensors": "compare",
    "compare_tokens": "compare",
    "evaluate": "feedback",
    "exercises_for_lab": "checks",
    "get_exercise": "checks",
    "register": "checks",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    """`labkit.grading.check` and the rest of `__all__`, from their modules, imported on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'labkit.grading' has no attribute {name!r}")
    return getattr(importlib.import_module(f"labkit.grading.{home}"), name)
