"""The registry of exercises: each exercise id ("lab2.decode_with_cache") maps to its check.

A check is written as a small spec rather than one opaque function, because the
grader runs it in two halves: the learner's functions run inside the notebook's
kernel, while the oracle and the comparison run in the grader's own process. The
in-notebook `labkit.check` simply runs both halves in one process.

Exercises of lab `X` are registered by the module `labkit.labs.X` (the course's
labs) or `labkit.grading.exercises.X` (the demo), imported the first time one of
its ids is looked up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from labkit.grading.result import Mismatch, Note


def call_first_function(functions: Sequence[Callable[..., Any]], inputs: Any) -> Any:
    """The default way to run an exercise: call its one function with the inputs as arguments."""
    return functions[0](*inputs)


@dataclass(frozen=True)
class Exercise:
    """How to check one exercise, split so that the grader can judge outside the learner's kernel.

    - `functions`: names of the learner's functions the exercise needs, looked up in
      the notebook's namespace.
    - `make_inputs(seed)`: builds the inputs; must be deterministic in the seed, since
      the kernel and the grader each build them.
    - `run(functions, inputs)`: calls the learner's code (in the kernel) and returns its
      outputs as plain data (tensors, numbers, strings, lists, tuples, dicts).
    - `oracle(inputs)`: the expected outputs, computed by the grader (use the real
      model wherever there is one).
    - `compare(expected, got)`: None when right (or a `Note` to say more), else the first `Mismatch`.
    - `tested`: one line saying what is checked; `hint`: what to look at when it fails.
    - `builds_on`: ids of earlier exercises whose functions this one's calls by name; it is graded
      with the course's own in their place (see `labkit.labs.common.pieces`), and a notebook cell
      that runs the learner's whole chain waits for all of them (`labkit.labs.common.gate`).
    - `answers`: dotted names of labkit's callables that solve this exercise: functions
      (``"labkit.kv.attention.causal_mask"``), classes (made through their ``__init__``) or methods
      (``"labkit.models.config.ModelConfig.kv_bytes_per_token"``); while `run` calls the learner's code
      they are out of its reach, and calling one fails the exercise (`labkit.grading.answers`). Name
      none that the check's own run (the engine it drives) calls or makes.
    - `source_rule(source)`: judges the exercise cell's source, read as data in the judging process
      (never run there): a `Mismatch` fails an exercise whose outputs passed, a `Note` is added to
      its verdict. Lab 11's says the cell holds Triton kernels only, which compile for a GPU.
    """

    id: str
    functions: tuple[str, ...]
    make_inputs: Callable[[int], Any]
    oracle: Callable[[Any], Any]
    compare: Callable[[Any, Any], Mismatch | Note | None]
    tested: str
    hint: str
    points: float = 1.0
    run: Callable[[Sequence[Callable[..., Any]], Any], Any] = call_first_function
    builds_on: tuple[str, ...] = ()
    answers: tuple[str, ...] = ()
    source_rule: Callable[[str], Mismatch | Note | None] | None = None

    @property
    def lab(self) -> str:
        """The lab the exercise belongs to: the part of its id before the first dot."""
        return lab_of(self.id)


_REGISTRY: dict[str, Exercise] = {}


def lab_of(exercise_id: str) -> str:
    """The lab an exercise id belongs to: lab2 for lab2.decode_with_cache."""
    lab, dot, name = exercise_id.partition(".")
    if not dot or not lab or not name:
        raise ValueError(f"exercise id {exercise_id!r} should look like '<lab>.<name>', e.g. 'lab2.decode_with_cache'")
    return lab


def register(exercise: Exercise) -> Exercise:
    """Add an exercise to the registry (a lab module re-imported in a notebook replaces its own entries)."""
    lab_of(exercise.id)
    if not exercise.functions:
        raise ValueError(f"exercise {exercise.id!r} names no learner functions; list them in `functions`")
    _REGISTRY[exercise.id] = exercise
    return exercise


# Packages that hold one module per lab, named after the lab, which registers its exercises.
LAB_PACKAGES = ("labkit.labs", "labkit.grading.exercises")


def lab_module(lab: str) -> str:
    """The name of the module that registers the lab's exercises, imported."""
    for package in LAB_PACKAGES:
        module_name = f"{package}.{lab}"
        try:
            importlib.import_module(module_name)
            return module_name
        except ModuleNotFoundError as error:
            if not module_name.startswith(error.name or "-"):  # a missing dependency inside the module
                raise
    places = " or ".join(f"{package}.{lab}" for package in LAB_PACKAGES)
    raise ValueError(f"no exercises are registered for lab {lab!r}: expected a module {places} that registers them")


def get_exercise(exercise_id: str) -> Exercise:
    """The exercise with this id, loading its lab's module if needed."""
    if exercise_id not in _REGISTRY:
        lab_module(lab_of(exercise_id))
    if exercise_id not in _REGISTRY:
        known = ", ".join(exercise.id for exercise in exercises_for_lab(lab_of(exercise_id))) or "none"
        raise ValueError(f"unknown exercise {exercise_id!r}; exercises of this lab: {known}")
    return _REGISTRY[exercise_id]


def exercises_for_lab(lab: str) -> list[Exercise]:
    """All exercises of a lab, in the order they were registered."""
    if not any(exercise.lab == lab for exercise in _REGISTRY.values()):
        lab_module(lab)
    return [exercise for exercise in _REGISTRY.values() if exercise.lab == lab]
