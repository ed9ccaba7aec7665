"""Each exercise graded on its own: a later exercise runs on the course's own earlier pieces.

A learner's ``prefill`` calls their ``causal_mask`` and ``attention`` by name, so with their own
pieces one wrong mask would fail three exercises, and the learner could not tell which to fix.
``on_its_own(exercise, *pieces)`` runs the learner's function with the course's implementation in
place of each earlier piece (swapped into the function's globals for the call, then put back), so one
mistake costs one point. The learner's own earlier pieces are checked on the side: when one fails,
the verdict on this exercise says so ("your prefill is right; your causal_mask (exercise 1) still
fails: ...") without taking this exercise's point.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from labkit.grading.checks import Exercise
from labkit.grading.result import Mismatch, Note
from labkit.labs.common.gate import exercise_number

_ABSENT = object()


@dataclass(frozen=True)
class Piece:
    """An earlier exercise (its check as registered, before any `on_its_own`) and the course's own answer to it."""

    exercise: Exercise
    course: Callable[..., Any]

    @property
    def name(self) -> str:
        """The name the learner's later functions call it by: ``causal_mask``."""
        return self.exercise.functions[0]


@dataclass(frozen=True)
class RunSide:
    """What the learner's kernel needs of a piece: its name, its check's run and the course's answer (never the
    oracle, the inputs' builder or the comparison, which stay in the grader's process)."""

    name: str
    run: Callable[..., Any]
    course: Callable[..., Any]


def run_side(piece: Piece) -> RunSide:
    return RunSide(piece.name, piece.exercise.run, piece.course)


@contextlib.contextmanager
def course_pieces(function: Callable[..., Any], pieces: Sequence[RunSide]) -> Iterator[None]:
    """While inside, the names of ``pieces`` in ``function``'s globals (the learner's notebook) mean the course's own."""
    namespace = getattr(function, "__globals__", None)
    if namespace is None:  # a class or a builtin: it reads no earlier piece by name
        yield
        return
    saved = {piece.name: namespace.get(piece.name, _ABSENT) for piece in pieces}
    namespace.update({piece.name: piece.course for piece in pieces})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is _ABSENT:
                namespace.pop(name, None)
            else:
                namespace[name] = value


def _learners_piece(function: Callable[..., Any], piece: RunSide) -> Callable[..., Any] | None:
    """The learner's own version of ``piece``, as ``function`` would call it; None if there is none to judge."""
    mine = getattr(function, "__globals__", {}).get(piece.name)
    return mine if callable(mine) and mine is not piece.course else None


def _run_piece(
    function: Callable[..., Any], pieces: Sequence[RunSide], index: int, inputs: Any
) -> dict[str, Any] | None:
    """The learner's own piece ``index`` run on its exercise's inputs (on the course's pieces before it)."""
    piece = pieces[index]
    mine = _learners_piece(function, piece)
    if mine is None:
        return None
    try:
        with course_pieces(mine, pieces[:index]):
            return {"outputs": piece.run((mine,), inputs)}
    except NotImplementedError:
        return {"not_done": True}


def _piece_problem(piece: Piece, expected: Any, got: Any) -> str | None:
    """What is wrong with the learner's own piece, in a few words, or None if it passes its check."""
    if got is None:
        return None
    where = f"your {piece.name} (exercise {exercise_number(piece.exercise)})"
    if got.get("not_done"):
        return f"{where} is not done yet"
    mismatch = piece.exercise.compare(expected, got["outputs"])
    if mismatch is None or isinstance(mismatch, Note):
        return None
    return f"{where} still fails its check ({mismatch.difference})"


def on_its_own(exercise: Exercise, *pieces: Piece) -> Exercise:
    """``exercise`` graded with the course's ``pieces`` in place of the learner's, whose own are checked on the side."""
    name = exercise.functions[0]

    def make_inputs(seed: int) -> dict[str, Any]:
        return {"own": exercise.make_inputs(seed), "earlier": [piece.exercise.make_inputs(seed) for piece in pieces]}

    def oracle(inputs: dict[str, Any]) -> dict[str, Any]:
        earlier = [piece.exercise.oracle(i) for piece, i in zip(pieces, inputs["earlier"])]
        return {"own": exercise.oracle(inputs["own"]), "earlier": earlier}

    def compare(expected, got) -> Mismatch | Note | None:
        mismatch = exercise.compare(expected["own"], got["own"])
        problems = [
            problem
            for piece, want, have in zip(pieces, expected["earlier"], got["earlier"])
            if (problem := _piece_problem(piece, want, have))
        ]
        if not problems:
            return mismatch
        also = "; ".join(problems)
        if mismatch is None or isinstance(mismatch, Note):
            return Note(
                f"your {name} is right (checked with the course's own earlier pieces), but {also}. "
                "Fix that exercise: its check says how, and this cell's demo waits for it."
            )
        return Mismatch(
            mismatch.difference,
            f"{mismatch.hint or exercise.hint} (This check ran your {name} on the course's own earlier pieces, "
            f"so the difference is in {name} itself; separately, {also}.)",
        )

    return dataclasses.replace(
        exercise,
        make_inputs=make_inputs,
        oracle=oracle,
        run=_run_on_course_pieces(exercise.run, tuple(map(run_side, pieces))),
        compare=compare,
        builds_on=tuple(piece.exercise.id for piece in pieces),
    )


def _run_on_course_pieces(own_run: Callable[..., Any], pieces: tuple[RunSide, ...]) -> Callable[..., Any]:
    """The kernel's half of ``on_its_own``: made apart from the exercise, so that it holds run-side parts only."""

    def run(functions, inputs: dict[str, Any]) -> dict[str, Any]:
        with course_pieces(functions[0], pieces):
            own = own_run(functions, inputs["own"])
        earlier = [_run_piece(functions[0], pieces, index, i) for index, i in enumerate(inputs["earlier"])]
        return {"own": own, "earlier": earlier}

    return run
