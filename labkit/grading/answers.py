"""While the learner's code runs for an exercise, labkit's own answer to that exercise is out of reach.

labkit holds the course's reference implementations (`labkit.kv.attention.causal_mask`, ...), and a
lab legitimately imports much of labkit. nbgrader and otter let a notebook call the reference and
pass. Here an exercise names the callables that solve it (`Exercise.answers`, dotted names), and for
as long as its `run` calls the learner's functions, each is swapped for a stub that fails the
exercise with a message saying why, then put back. The grader's kernel and `labkit.check` both go
through `attempt_exercise`, so a learner meets this in the notebook before handing it in. Every
other part of labkit keeps working, and the oracle, which runs outside `run`, uses the real one.

Where the stub stands in, by identity with the reference:
- a function: the attribute of the module that defines it, and of any labkit package that re-exports
  it (`labkit.kv.attention.causal_mask`, `import labkit.kv.attention as a; a.causal_mask(...)`);
  the globals of the learner's functions, i.e. the notebook's names (`from labkit.kv.attention
  import causal_mask` binds early, so that binding is swapped too), and a learner's function that
  is the reference itself;
- a class (`labkit.kv.block_allocator.FreeListBlockAllocator`): its `__init__`, so that making one,
  or one of a subclass that inherits it (an alias or `class Mine(FreeListBlockAllocator): pass`),
  fails; the class itself stays, so labkit's own `isinstance` checks keep working;
- a method (`labkit.models.config.ModelConfig.kv_bytes_per_token`): the attribute of its class.

So an answer is declared only where labkit's code that runs inside `run` (the engine a check drives,
the server it starts) does not call it or make one: the tests run the honest control of each.

Which exercise declares which answers is not listed here by hand: `ledger(labs)` reads it from the registry,
`tests/test_grading_answers.py` has a cheating submission per declared answer and one notebook per lab,
and it fails while an exercise that declares none is missing from the list below.

Not covered, and why:
- lab1.prefill, lab1.generate_without_cache, lab10.quality, lab10.fleet: not reviewed yet (their checks
  drive labkit code that may itself call a candidate answer).
- lab11.paged_decode, lab11.split_kv: the exercise cell's source rule admits only Triton kernels, which
  cannot call into labkit.
- lab2.conversations_that_fit: labkit has no function of those arguments (`kv_pool_size` sizes a pool
  from the device's own memory); the arithmetic is the oracle's, inline.
- lab3.generate_static_batch: no labkit function decodes a padded batch through the model the check
  hands in (labkit's engine and its `StaticBatching` run their own paged cache), and the check puts
  the course's `padded_layout` and mask in place of the learner's (`on_its_own`): they must stay.
- lab9.engine_turn: a turn is made of the engine's own calls (`llm.add_request`, `abort_request`,
  `step`), which the exercise asks for and the check's engine needs; labkit's server loop
  (`labkit.serve.worker.EngineWorker`) takes its commands otherwise, in its own thread.
- lab9.find_capacity: the sweep drives the server and load generator the check starts
  (`labkit.serve.background.measure`), and its rule is lab9.highest_rate's, which the check runs in
  the learner's place (`course_highest_rate`): blocking either would fail honest sweeps.
- lab14.expert_parallel: no labkit function splits a mixture's experts over ranks (the check's one-process
  oracle, `course_dispatch`, is lab14.dispatch's answer, blocked there; here it is not a solution: it sends nothing).

Not covered either: a reference reached through another labkit module's own import of it (labkit's
internal code must keep calling it), or kept in a closure, a default argument, a container or a
`functools.partial`, or dug out of `gc`; a subclass with its own `__init__` that never calls labkit's
still inherits the rest of a blocked class. This stops the shortcut that needs no effort; reading the
exercise cells remains the check against one that does.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any

from labkit.grading.grader_only import hidden_here, is_grader_only

# labkit's own code that runs inside `run` (the checks and the grader) keeps its references.
_CHECKING_PACKAGES = ("labkit.labs", "labkit.grading")
_ABSENT = object()


class ReferenceAnswerCalled(RuntimeError):
    """The learner's code called labkit's answer to the exercise being checked."""


def _owner(dotted: str) -> tuple[Any, str]:
    """The module or class that holds what `dotted` names, and the attribute's name there: the longest
    importable prefix is the module, the rest a path of attributes (`labkit.models.config.ModelConfig.kv_bytes_per_token`)."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:-1]:
            owner = getattr(owner, name)
        return owner, parts[-1]
    raise ModuleNotFoundError(f"no module in {dotted!r}")


def _hidden(dotted: str) -> bool:
    """Whether `dotted` lies in a grader-only module that this process sees as the sandbox's stub."""
    parts = dotted.split(".")
    prefixes = (".".join(parts[:cut]) for cut in range(len(parts) - 1, 0, -1))
    return any(is_grader_only(prefix) and hidden_here(prefix) for prefix in prefixes)


def reference(dotted: str) -> Any:
    """The object a dotted name such as `labkit.kv.attention.causal_mask` names (its module imported)."""
    owner, attribute = _owner(dotted)
    return getattr(owner, attribute)


def _stub(exercise_id: str, dotted: str, called: list[str]) -> Callable[..., Any]:
    message = (
        f"{exercise_id}: your code called {dotted}, the reference answer to this exercise; write your own "
        "(labkit's answer is out of reach while this exercise is checked)"
    )

    def refuse(*args: Any, **kwargs: Any) -> Any:
        called.append(message)
        raise ReferenceAnswerCalled(message)

    return refuse


def _places(defining: str, namespaces: Sequence[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    """Where the learner can reach a reference defined in module `defining`: that module, labkit's
    packages (re-exports) and the learner's own namespaces."""
    packages = [
        vars(module)
        for name, module in list(sys.modules.items())
        if (name == "labkit" or name.startswith("labkit."))
        and hasattr(module, "__path__")
        and not name.startswith(_CHECKING_PACKAGES)
    ]
    return [vars(sys.modules[defining]), *packages, *namespaces]


def _namespace_of(function: Any) -> MutableMapping[str, Any] | None:
    """The globals `function` reads names from: its own, or for a class, its module's."""
    if isinstance(function, type):
        module = sys.modules.get(function.__module__)
        return vars(module) if module is not None else None
    return getattr(function, "__globals__", None)


@contextlib.contextmanager
def answers_blocked(
    exercise_id: str, answers: Sequence[str], functions: tuple[Any, ...]
) -> Iterator[tuple[tuple[Any, ...], list[str]]]:
    """Inside: the exercise's `answers` are stubs wherever the learner's `functions` can reach them. Yields the
    functions to call (a learner's function that is a reference, replaced) and the list of messages of the
    stubs called, so that catching the error does not hide the call. Everything is put back on leaving.
    An answer in a module the grading sandbox hides is out of reach there already, and left alone."""
    namespaces = [space for space in map(_namespace_of, functions) if space is not None]
    swapped: list[tuple[MutableMapping[str, Any], str, Any]] = []
    called: list[str] = []
    reachable = [dotted for dotted in answers if not _hidden(dotted)]
    originals = [(dotted, reference(dotted)) for dotted in reachable]  # a bad name fails before any swap
    stubs: dict[int, Callable[..., Any]] = {}
    in_classes: list[tuple[type, str, Any]] = []  # (class, attribute, what its own __dict__ held, or _ABSENT)
    for dotted, original in originals:
        stub = stubs[id(original)] = _stub(exercise_id, dotted, called)
        owner, attribute = _owner(dotted)
        if isinstance(original, type) or isinstance(owner, type):  # a class: its __init__; a method: itself
            cls, attribute = (original, "__init__") if isinstance(original, type) else (owner, attribute)
            in_classes.append((cls, attribute, cls.__dict__.get(attribute, _ABSENT)))
            setattr(cls, attribute, stub)  # the class itself stays: labkit's own isinstance checks keep working
            continue
        for place in _places(owner.__name__, namespaces):
            for key, value in list(place.items()):
                if value is original:
                    swapped.append((place, key, value))
                    place[key] = stub
    try:
        yield tuple(stubs.get(id(function), function) for function in functions), called
    finally:
        for place, key, value in reversed(swapped):
            place[key] = value
        for cls, attribute, held in reversed(in_classes):
            if held is _ABSENT:
                delattr(cls, attribute)
            else:
                setattr(cls, attribute, held)


def ledger(labs: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Every exercise of ``labs`` (``["lab1", ...]``) and the answers it declares (empty: none), read from the registry."""
    from labkit.grading.checks import exercises_for_lab

    return {exercise.id: exercise.answers for lab in labs for exercise in exercises_for_lab(lab)}
