"""Hints in tiers: each ``labkit.hint("lab2.kv_cache")`` shows the next one.

An exercise cell says what to build and why, with no code; a learner who is stuck asks for a
hint and gets the idea first, then the structure, then something close to code, one tier per
call, so each can stop as soon as they see the way. A lab module lists the tiers with
``register_hints``; an exercise without its own tiers has its check's hint as its only one.

How many tiers each exercise revealed is counted in this kernel (``hints_shown()``), so that
whoever grades the notebook can ask for it; the count is reported, never taken as a score.
"""

from __future__ import annotations

from labkit.grading.checks import get_exercise
from labkit.grading.graded_run import HINT_NOT_SHOWN, in_graded_run
from labkit.grading.hint_counts import hints_shown, note_hint_shown, note_tiers

__all__ = ["hint", "hints_shown", "register_hints", "tiers"]

_TIERS: dict[str, tuple[str, ...]] = {}


def register_hints(exercise_id: str, *tiers: str) -> None:
    """Give an exercise its hints, from the idea to near-code (at least two)."""
    if len(tiers) < 2:
        raise ValueError(f"{exercise_id}: give at least two tiers of hints (the idea, then the structure)")
    _TIERS[exercise_id] = tiers
    note_tiers(exercise_id, len(tiers))


def tiers(exercise_id: str) -> tuple[str, ...]:
    """The exercise's hints in order (looking it up imports its lab, which registers them)."""
    exercise = get_exercise(exercise_id)
    return _TIERS.get(exercise_id, (exercise.hint,))


def hint(exercise_id: str) -> None:
    """Show the next hint of an exercise; after the last, show the last again. In the grader's sandbox,
    where the lab's hints are out of reach, it is only counted (the grader caps the count at the tiers)."""
    try:
        levels = tiers(exercise_id)
    except ValueError:
        if not in_graded_run():
            raise
        note_hint_shown(exercise_id, hints_shown().get(exercise_id, 0) + 1)
        print(HINT_NOT_SHOWN)
        return
    number = min(hints_shown().get(exercise_id, 0) + 1, len(levels))
    note_hint_shown(exercise_id, number)
    more = "call again for the next one" if number < len(levels) else "that is the last one"
    print(f"Hint {number} of {len(levels)} for {exercise_id} ({more}):\n{levels[number - 1]}")
