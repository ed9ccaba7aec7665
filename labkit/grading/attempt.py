"""Run the learner's side of an exercise and capture what happened, never letting it escape.

Used in two places with the same code: by `labkit.check` in the notebook, and by
the grader's request inside the submission's kernel (`request.py`). The outcome is an `Attempt`: the
outputs as plain data, or why there are none (not done, missing function, error).
"""

from __future__ import annotations

import numbers
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.grading.answers import answers_blocked
from labkit.grading.checks import Exercise
from labkit.grading.result import ERROR, MISSING, NOT_DONE

OK = "ok"

# Frames in these folders are library code, not the learner's.
_LIBRARY_DIRS = tuple(
    str(Path(path).resolve()) + os.sep
    for path in {sysconfig.get_path("stdlib"), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    | {str(Path(__file__).resolve().parents[1])}  # labkit itself
)


@dataclass(frozen=True)
class Attempt:
    """The learner's outputs (status "ok") or why there are none."""

    status: str
    message: str = ""
    outputs: Any = None

    def to_record(self) -> dict[str, Any]:
        """The plain-data form the kernel hands to the grader."""
        return {"status": self.status, "message": self.message, "outputs": self.outputs}


def to_plain_data(value: Any, where: str = "the output") -> Any:
    """A copy made only of tensors, numbers, strings, None, lists, tuples and str-keyed dicts.

    This is all the grader will load back (`result_check.py`), so anything else is rejected here with a
    message that says where it sits. Torch is not imported for it: where the learner's code never
    imported torch, no value can be a tensor.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous().clone().as_subclass(torch.Tensor)  # owns its data, as the grader asks
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (list, tuple)):
        items = [to_plain_data(item, f"{where}[{index}]") for index, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise TypeError(f"{where} is a dict with non-string keys; use string keys")
        return {key: to_plain_data(item, f"{where}[{key!r}]") for key, item in value.items()}
    raise TypeError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}; return torch tensors, "
        "numbers, strings, lists, tuples or dicts"
    )


def _is_learner_frame(frame: traceback.FrameSummary) -> bool:
    filename = frame.filename
    if filename.startswith("<") and not filename.startswith("<ipython-input"):
        return False
    return not str(Path(filename).resolve()).startswith(_LIBRARY_DIRS)


def describe_exception(error: BaseException) -> str:
    """One line: the error and the last line of the learner's own code it passed through."""
    frames = traceback.extract_tb(error.__traceback__)
    learner_frames = [frame for frame in frames if _is_learner_frame(frame)]
    summary = f"{type(error).__name__}: {error}".rstrip(": ")
    frame = (learner_frames or frames)[-1] if frames else None
    if frame is None:
        return summary
    code = f": {frame.line.strip()}" if frame.line else ""
    return f"{summary} (in {frame.name}, line {frame.lineno}{code})"


def functions_in(names: Sequence[str], namespace: Mapping[str, Any]) -> tuple[Callable[..., Any], ...] | Attempt:
    """The learner's functions, found by name (e.g. in the notebook's globals), or a MISSING attempt naming them."""
    missing = [name for name in names if not callable(namespace.get(name))]
    if missing:
        listed = ", ".join(f"`{name}`" for name in missing)
        return Attempt(
            MISSING, f"no function named {listed} is defined: run the exercise cell that defines it (and keep its name)"
        )
    return tuple(namespace[name] for name in names)


def attempt_in_namespace(exercise: Exercise, namespace: Mapping[str, Any], seed: int) -> Attempt:
    """Find the learner's functions by name (e.g. in the notebook's globals) and attempt the exercise."""
    found = functions_in(exercise.functions, namespace)
    return found if isinstance(found, Attempt) else attempt_exercise(exercise, found, seed)


def attempt_exercise(exercise: Exercise, functions: tuple[Callable[..., Any], ...], seed: int) -> Attempt:
    """Build the inputs from the seed and attempt the exercise with them (the notebook's check does)."""
    return attempt_with(exercise.id, exercise.answers, exercise.run, functions, exercise.make_inputs(seed))


def attempt_with(
    exercise_id: str,
    answers: Sequence[str],
    run: Callable[[Sequence[Callable[..., Any]], Any], Any],
    functions: tuple[Callable[..., Any], ...],
    inputs: Any,
) -> Attempt:
    """Run the learner's functions through `run` on the inputs and capture the outcome; a call to labkit's
    own answer to the exercise fails it, even where their code caught the error. The grader's kernel and
    the notebook's check both come here."""
    with answers_blocked(exercise_id, answers, functions) as (functions, called):
        attempt = _run(run, functions, inputs)
    return Attempt(ERROR, called[0]) if called else attempt


def _run(
    run: Callable[[Sequence[Callable[..., Any]], Any], Any], functions: tuple[Callable[..., Any], ...], inputs: Any
) -> Attempt:
    try:
        outputs = run(functions, inputs)
    except NotImplementedError:
        return Attempt(NOT_DONE)
    except Exception as error:  # the learner's bug, reported as feedback rather than a traceback wall
        return Attempt(ERROR, f"your code raised {describe_exception(error)}")
    try:
        plain = to_plain_data(outputs)
    except TypeError as error:
        return Attempt(ERROR, f"the grader cannot compare what your code returned: {error}")
    return Attempt(OK, outputs=plain)
