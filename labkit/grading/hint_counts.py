"""How many hints each exercise showed, in the graded run, and what an instructor may make them cost.

``labkit.hint`` counts the tiers it showed in the kernel (:mod:`labkit.labs.hints`). After the
notebook has run, the grader asks the kernel for those counts (the hint cells the learner kept
ran again) and records them next to each verdict. They are reported, not penalised: only an
instructor who asks for it (``labkit grade --hint-penalty 0.1``) takes that fraction of the
exercise's points per hint shown, from an exercise that passed, never below zero.

The counts come from the learner's kernel, so they are information, not evidence: a learner can
delete a hint cell or patch the counter. Read them as "hints the notebook still asks for".
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from labkit.grading.result import CheckResult
from labkit.grading.untrusted_file import UntrustedFileRefused, read_untrusted

MAX_COUNTED = 99  # more than any exercise has tiers; caps a tampered file
MAX_FILE_BYTES = 64 << 10  # far more than the counts of every exercise of a lab take

# In a learner's kernel: exercise id -> how many hint tiers labkit.hint has shown. It lives here,
# below labkit.labs, so that the grader's kernel-side code can read it without importing the labs.
_shown: dict[str, int] = {}
# Exercise id -> how many tiers of hints it has (registered with its lab; one, its check's hint, otherwise).
_tiers: dict[str, int] = {}


def note_hint_shown(exercise_id: str, number: int) -> None:
    """Record that the exercise's hint number `number` (1-based) was shown in this kernel."""
    _shown[exercise_id] = max(number, _shown.get(exercise_id, 0))


def note_tiers(exercise_id: str, count: int) -> None:
    """Record how many tiers of hints the exercise has (`labkit.labs.hints.register_hints` does)."""
    _tiers[exercise_id] = count


def tier_count(exercise_id: str) -> int:
    """How many tiers of hints the exercise has: the most a notebook can have been shown."""
    return _tiers.get(exercise_id, 1)


def hints_shown() -> dict[str, int]:
    """Exercise id -> how many of its hints this kernel has shown."""
    return dict(_shown)


def self_reported(penalty: float) -> str:
    """What the reports and the class summary say whenever hints cost points: whose word the counts are."""
    return (
        f"--hint-penalty {penalty:g}: the hint counts are self-reported. The learner's own kernel counted "
        "them, and no grader can see what happened on the learner's machine: a hint cell deleted or a "
        "counter cleared before handing in counts as no hint."
    )


def read_hint_counts(path: Path) -> dict[str, int]:
    """Exercise id -> hints shown, from the file the kernel wrote; anything malformed counts as none.

    The kernel could have left a FIFO, a link or a sparse file of terabytes there: it is read as any
    file from a submission is, bounded and without blocking (:mod:`labkit.grading.untrusted_file`)."""
    path = Path(path)
    try:
        data = json.loads(read_untrusted(path.parent, path.name, MAX_FILE_BYTES) or b"{}")
    except (OSError, ValueError, UntrustedFileRefused):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(key): min(int(value), MAX_COUNTED)
        for key, value in data.items()
        if isinstance(value, int) and not isinstance(value, bool) and value > 0
    }


def weigh_hints(result: CheckResult, shown: int, penalty: float = 0.0) -> CheckResult:
    """The verdict with its hint count recorded, and ``penalty`` x max points taken per hint if asked."""
    points = result.points
    if penalty and result.passed and shown:
        points = max(0.0, result.points - penalty * shown * result.max_points)
    return dataclasses.replace(result, hints_shown=shown, points=round(points, 6))
