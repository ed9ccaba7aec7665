"""What a check hands back: a verdict with points and a message a learner can act on.

`Mismatch` is what a comparer returns when the learner's output differs from the
oracle's (where it differs, and optionally a hint for that kind of mistake);
`CheckResult` is the finished verdict that the notebook shows and the grader records.
"""

from __future__ import annotations

from dataclasses import dataclass

# Every status a verdict can carry. Only PASS earns points.
PASS = "pass"
FAIL = "fail"
NOT_DONE = "not_done"  # the exercise still raises NotImplementedError
ERROR = "error"  # the learner's code raised, or returned something the grader cannot compare
MISSING = "missing"  # a function the exercise needs is not defined
TIMEOUT = "timeout"
CRASHED = "crashed"  # the kernel died while running the learner's function
NOT_RUN = "not_run"  # the grader could not get to this exercise at all

STATUS_LABELS = {
    PASS: "PASS",
    FAIL: "FAIL",
    NOT_DONE: "NOT DONE",
    ERROR: "ERROR",
    MISSING: "MISSING",
    TIMEOUT: "TIMEOUT",
    CRASHED: "CRASHED",
    NOT_RUN: "NOT RUN",
}


@dataclass(frozen=True)
class Mismatch:
    """The first difference a comparer found, e.g. "at layer 3, position 5: expected 0.12, got 0.57"."""

    difference: str
    hint: str | None = None  # overrides the exercise's general hint when the mistake is recognisable

    def within(self, label: str) -> Mismatch:
        """The same difference, located inside a larger output ("step 4, at position 2: ...")."""
        return Mismatch(f"{label}, {self.difference}", self.hint)


@dataclass(frozen=True)
class Note:
    """What a comparer returns for a right answer with a remark on something else: the point is earned,
    and the message says it ("your prefill is right; your causal_mask (exercise 1) still fails: ...")."""

    text: str


@dataclass(frozen=True)
class CheckResult:
    """A verdict: passed or not, the points earned, and the message shown to the learner."""

    passed: bool
    points: float
    message: str
    exercise: str = ""
    status: str = ""
    max_points: float = 0.0
    hints_shown: int = 0  # tiers of labkit.hint the notebook showed for this exercise (see hint_counts)

    @property
    def label(self) -> str:
        """The status as a word for people: PASS, FAIL, NOT DONE, ..."""
        return STATUS_LABELS.get(self.status, self.status.upper())

    def to_dict(self) -> dict[str, object]:
        """Plain data for the grader's JSON report."""
        return {
            "id": self.exercise,
            "status": self.status,
            "passed": self.passed,
            "points": self.points,
            "max_points": self.max_points,
            "message": self.message,
            "hints_shown": self.hints_shown,
        }
