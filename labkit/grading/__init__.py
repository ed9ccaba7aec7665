"""Grading: in-notebook checks with instant feedback, and the `labkit grade` autograder.

- `check("lab2.decode_with_cache", fn)` shows PASS/FAIL with the first difference and a hint.
- `checks` is the registry of exercise specs; `compare` holds the comparison helpers.
- `labkit make-labs` turns solved lab sources into learner notebooks; `labkit grade`
  runs each submission in a sandboxed kernel and judges it in limited child processes.
See README.md in this folder for the instructor's view.
"""

from labkit.grading.checks import Exercise, exercises_for_lab, get_exercise, register
from labkit.grading.compare import compare_sequences, compare_tensors, compare_tokens
from labkit.grading.feedback import check, evaluate
from labkit.grading.result import CheckResult, Mismatch

__all__ = [
    "CheckResult",
    "Exercise",
    "Mismatch",
    "check",
    "compare_sequences",
    "compare_tensors",
    "compare_tokens",
    "evaluate",
    "exercises_for_lab",
    "get_exercise",
    "register",
]
