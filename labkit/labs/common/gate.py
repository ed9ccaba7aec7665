"""Cells that build on an exercise run only once that exercise passes its check (``if passed("lab1.prefill"): ...``).

A function that is merely attempted is not enough: a wrong one would print garbage or crash the demo, far from the
mistake. An exercise graded on the course's own earlier pieces (``Exercise.builds_on``) also waits for those
exercises: the demo runs the learner's whole chain. The verdict is kept per function object (the check cell's own
verdict included), so a cell that asks again costs nothing, and redefining the function asks afresh."""

from __future__ import annotations

import sys
from typing import Any

from labkit.grading.checks import Exercise, exercises_for_lab, get_exercise
from labkit.grading.feedback import evaluate, known_verdict
from labkit.grading.graded_run import DEMO_SKIPPED, in_graded_run


def exercise_number(exercise: Exercise) -> int:
    """The exercise's number in its lab: checks of the same function (a second check) share one."""
    first_functions = list(dict.fromkeys(other.functions[0] for other in exercises_for_lab(exercise.lab)))
    return first_functions.index(exercise.functions[0]) + 1


def passes(exercise_id: str, namespace: dict[str, Any], seed: int = 0) -> bool:
    """Whether the functions named in ``namespace`` pass the exercise's check (run only if not yet judged)."""
    exercise = get_exercise(exercise_id)
    functions = tuple(namespace.get(name) for name in exercise.functions)
    if not all(callable(function) for function in functions):
        return False
    known = known_verdict(exercise_id, functions, seed)
    return known if known is not None else evaluate(exercise_id, *functions, seed=seed).passed


def passed(*exercise_ids: str) -> bool:
    """True if every named exercise passes its check; otherwise say which one the cell waits for.

    The learner's functions are looked up among the caller's globals (the notebook's variables). In the
    grader's kernel the checks are the grader's, so every such cell is skipped there (graded_run.py).
    """
    if in_graded_run():
        print(DEMO_SKIPPED)
        return False
    namespace = sys._getframe(1).f_globals
    needed = dict.fromkeys(earlier for one in exercise_ids for earlier in (*get_exercise(one).builds_on, one))
    for exercise_id in needed:
        if not passes(exercise_id, namespace):
            exercise = get_exercise(exercise_id)
            print(
                f"(skipped until exercise {exercise_number(exercise)} passes: this cell uses your "
                f"{', '.join(exercise.functions)}; its check says what to fix)"
            )
            return False
    return True
