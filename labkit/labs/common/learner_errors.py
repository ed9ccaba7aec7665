"""An exception inside a learner's code, caught in the kernel as a plain record instead of a traceback, so that the
grader can judge it in its own process like any other output (``diagnose.diagnosed`` says what it means)."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from typing import Any

RAISED = "raised"  # the key of the record in place of the learner's outputs


def learner_files(functions: Sequence[Any]) -> set[str]:
    """The files (notebook cells) where the learner's functions, or their classes' methods, were written."""
    files = set()
    for function in functions:
        members = vars(function).values() if isinstance(function, type) else [function]
        for member in members:
            member = getattr(member, "fget", member)  # a property's code is its getter's
            code = getattr(member, "__code__", None)
            if code is not None:
                files.add(code.co_filename)
    return files


def raised_record(error: BaseException, functions: Sequence[Any]) -> dict[str, Any]:
    """What the learner's code raised and where: the innermost frame in one of their cells."""
    frames = traceback.extract_tb(error.__traceback__)
    files = learner_files(functions)
    theirs = [frame for frame in frames if frame.filename in files]
    frame = theirs[-1] if theirs else None
    named = [other.name for other in theirs if not other.name.startswith("<")]  # not <listcomp>, <lambda>
    return {
        "error": type(error).__name__,
        "message": str(error),
        "function": named[-1] if named else frame.name if frame else "",
        "line": frame.lineno if frame else 0,
        "code": (frame.line or "").strip() if frame else "",
    }


def capture(functions: Sequence[Any], work: Callable[[], Any]) -> Any:
    """``work()``, or the record of what the learner's code raised in it (NotImplementedError escapes:
    it is the blank an exercise starts as, and reads "not done")."""
    try:
        return work()
    except NotImplementedError:
        raise
    except Exception as error:  # any bug of the learner's becomes a diagnosis
        return {RAISED: raised_record(error, functions)}


def noting_errors(function: Callable[..., Any]) -> tuple[Callable[..., Any], list[dict[str, Any]]]:
    """``function`` wrapped so that what it raises is noted (then raised on), for checks where the engine,
    not the check, calls the learner's code and turns an exception into a failed run."""
    records: list[dict[str, Any]] = []

    def noted(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except NotImplementedError:
            raise
        except Exception as error:
            records.append(raised_record(error, [function]))
            raise

    return noted, records


def raised_in(got: Any) -> dict[str, Any] | None:
    """The record of an exception if ``got`` is one, else None."""
    return got[RAISED] if isinstance(got, dict) and RAISED in got else None
