"""In the grader's kernel the checks are the grader's: what `labkit.check`, `passed` and `labkit.hint` do there.

The grader sets `LABKIT_GRADING=1` in the kernel it runs a submission in (with or without a sandbox). The
checks' oracles are not in that kernel (`grader_only.py`), and the grader checks every exercise itself after
the notebook has run, so a check cell says so instead of checking, and a demo cell that waits for a check is
skipped. A hint is still counted (the grader reports the counts), though its text may be out of reach there.
"""

from __future__ import annotations

import os

from labkit.grading.result import NOT_RUN, CheckResult

GRADED_RUN = "LABKIT_GRADING"


def in_graded_run() -> bool:
    """Whether this process is a kernel the grader runs a submission in."""
    return os.environ.get(GRADED_RUN) == "1"


def check_left_to_grader(exercise_id: str) -> CheckResult:
    """What `labkit.check` gives in the graded run: nothing checked here, and one line saying why."""
    message = f"(graded run: the grader checks {exercise_id} itself after the notebook has run)"
    return CheckResult(passed=False, points=0.0, message=message, exercise=exercise_id, status=NOT_RUN)


DEMO_SKIPPED = "(graded run: demo cells that wait for a check are skipped)"
HINT_NOT_SHOWN = "(graded run: hints are not shown here; this one is counted)"
