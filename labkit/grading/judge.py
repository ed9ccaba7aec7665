"""Turn the learner's outputs into a verdict by comparing them with the oracle's.

The grader calls this in its own process, on outputs loaded back from the kernel;
`labkit.check` calls it in the notebook. Either way the message has the same shape:
a headline, what was tested, the first difference (or the problem), and a hint.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import OrderedDict
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from labkit.grading.attempt import OK, Attempt, describe_exception
from labkit.grading.checks import Exercise
from labkit.grading.result import ERROR, FAIL, NOT_DONE, PASS, STATUS_LABELS, CheckResult, Mismatch, Note


def _not_done_advice(exercise: Exercise) -> str:
    """Names the functions to write: a check may test one written in an earlier exercise's cell."""
    names = " and ".join(f"`{name}`" for name in exercise.functions) or "your code"
    return (
        f"write {names} in place of the `raise NotImplementedError(...)` line of its exercise cell, run that "
        "cell, then run this check again."
    )


def verdict(exercise: Exercise, status: str, detail: str = "", hint: str | None = None) -> CheckResult:
    """A CheckResult with the standard message for this status."""
    headline = f"{STATUS_LABELS[status]} {exercise.id}"
    if status == PASS:
        lines = [headline, f"Tested: {exercise.tested}"] + ([f"Note: {detail}"] if detail else [])
    elif status == NOT_DONE:
        lines = [f"{headline}: {_not_done_advice(exercise)}"]
    else:
        label = "First difference" if status == FAIL else "Problem"
        lines = [headline, f"Tested: {exercise.tested}", f"{label}: {detail}", f"Hint: {hint or exercise.hint}"]
    passed = status == PASS
    return CheckResult(
        passed=passed,
        points=exercise.points if passed else 0.0,
        message="\n".join(lines),
        exercise=exercise.id,
        status=status,
        max_points=exercise.points,
    )


_RECENT = 8  # oracle outputs kept per process: a notebook's check and the gate after it ask for the same one
_recent: OrderedDict[tuple[str, int], Any] = OrderedDict()


def _oracle_on_cpu(exercise: Exercise, seed: int) -> Any:
    """The oracle's outputs with their tensors on the CPU, where the learner's outputs come back: a check's
    inputs live on labkit's device (a GPU's tensors too), and the comparison needs both sides in one place."""
    return tree_map_only(torch.Tensor, torch.Tensor.cpu, exercise.oracle(exercise.make_inputs(seed)))


def expected_outputs(exercise: Exercise, seed: int) -> Any:
    """The oracle's outputs for the inputs this seed gives.

    An oracle is deterministic in the seed, and some run the model for seconds, so the last few are
    kept: a notebook's ``check`` and the ``passed`` gate of the demo after it compute it once. Each
    caller gets its own copy, so no comparison can change what the next one is given.
    """
    key = (exercise.id, seed)
    if key in _recent:
        _recent.move_to_end(key)
    else:
        _recent[key] = _oracle_on_cpu(exercise, seed)
        while len(_recent) > _RECENT:
            _recent.popitem(last=False)
    return copy.deepcopy(_recent[key])


def judge(exercise: Exercise, attempt: Attempt, expected: Any) -> CheckResult:
    """Compare an attempt with the oracle's outputs; only a clean match passes."""
    if attempt.status != OK:
        return verdict(exercise, attempt.status, attempt.message)
    try:
        mismatch = exercise.compare(expected, attempt.outputs)
    except Exception as error:  # odd learner output that the comparer did not foresee
        mismatch = Mismatch(f"your output could not be compared with the expected one ({describe_exception(error)})")
    if mismatch is None or isinstance(mismatch, Note):
        return verdict(exercise, PASS, mismatch.text if mismatch else "")
    return verdict(exercise, FAIL, mismatch.difference, mismatch.hint)


def with_source_rule(exercise: Exercise, result: CheckResult, source: str) -> CheckResult:
    """The verdict once the exercise's `source_rule` has read its cell's `source`: a rule broken fails
    outputs that passed; a note from it is added to a pass. Other verdicts stand as they are."""
    if exercise.source_rule is None or not result.passed:
        return result
    try:
        finding = exercise.source_rule(source)
    except Exception as error:  # a source the rule did not foresee (nested too deep, ...): no pass on trust
        return verdict(exercise, ERROR, f"the rule on your exercise cell's source could not be applied: {error!r:.200}")
    if isinstance(finding, Mismatch):
        return verdict(exercise, FAIL, finding.difference, finding.hint)
    if isinstance(finding, Note):
        return dataclasses.replace(result, message=f"{result.message}\nNote: {finding.text}")
    return result
