"""One exercise's request to a learner's kernel: the grader builds it, the kernel runs it.

The seed never enters the kernel. The grader builds the exercise's inputs from its secret seed in its
own process and writes them, with the learner functions' names, the declared `answers` and the `run`
that calls the learner's code, to a file in the submission's folder (cloudpickle). The kernel's agent
(`kernel_side.save_attempt`) loads it, runs `run` with the answers blocked, and saves plain outputs
that the grader compares with its own oracle.

What travels, and how: `run` and whatever it reaches in the grader-only modules by value (those are not
importable in the sandbox: `grader_only.py`); the rest of labkit by reference; the course model, the tiny
models and the course tokenizer by name (pickle's persistent ids), so that the kernel loads its own from
the same read-only cache instead of receiving hundreds of megabytes. Pickle goes one way only, grader to
kernel: the kernel is the untrusted side, and what comes back is read as plain data (`result_check.py`).

The file's first line names the learner's functions (JSON), so that the kernel can find them missing before
it unpickles the inputs: where those hold tensors, loading them imports torch, which a notebook that defines
none of the functions may never have needed.
"""

from __future__ import annotations

import importlib
import io
import json
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import cloudpickle

from labkit.grading.attempt import Attempt, attempt_with, functions_in
from labkit.grading.checks import Exercise
from labkit.grading.grader_only import send_by_value

T = TypeVar("T")
# id -> (the object, how the kernel makes it again): what a request names rather than copies.
_BY_NAME: dict[int, tuple[object, tuple[str, str, tuple[Any, ...], str | None]]] = {}


def sent_by_name(value: T, maker: Callable[..., Any], *args: Any, attribute: str | None = None) -> T:
    """Mark `value`, which `maker(*args)` gives (or its `attribute`), to travel in a request by name: the kernel
    calls `maker(*args)` itself, loading the model from the same read-only cache. `maker` must be visible."""
    _BY_NAME[id(value)] = (value, (maker.__module__, maker.__qualname__, args, attribute))
    return value


def _made_again(module: str, qualname: str, args: tuple[Any, ...], attribute: str | None) -> Any:
    value = getattr(importlib.import_module(module), qualname)(*args)
    return getattr(value, attribute) if attribute else value


@dataclass(frozen=True)
class Request:
    """What a kernel needs to attempt one exercise: never its seed, oracle or comparison."""

    exercise_id: str
    functions: tuple[str, ...]
    answers: tuple[str, ...]
    run: Callable[[Sequence[Callable[..., Any]], Any], Any]
    inputs: Any

    def attempt(self, namespace: Mapping[str, Any]) -> Attempt:
        """Find the learner's functions by name in `namespace` and run them on the inputs, answers blocked."""
        found = functions_in(self.functions, namespace)
        if isinstance(found, Attempt):
            return found
        return attempt_with(self.exercise_id, self.answers, self.run, found, self.inputs)


def build_request(exercise: Exercise, seed: int) -> Request:
    """The request for `exercise`, its inputs built here from `seed`."""
    return Request(exercise.id, exercise.functions, exercise.answers, exercise.run, exercise.make_inputs(seed))


class _Pickler(cloudpickle.CloudPickler):
    def persistent_id(self, obj: Any) -> tuple | None:
        entry = _BY_NAME.get(id(obj))
        return entry[1] if entry is not None and entry[0] is obj else None


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid: Any) -> Any:
        return _made_again(*pid)


def request_bytes(request: Request, pickler: type[cloudpickle.CloudPickler] = _Pickler) -> bytes:
    """The request as the file the kernel reads: a line naming the functions, then the pickle (`pickler`
    lets a test watch what it reaches)."""
    send_by_value()
    buffer = io.BytesIO()
    buffer.write(json.dumps(list(request.functions)).encode() + b"\n")
    pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(request)
    return buffer.getvalue()


def requested_functions(data: bytes) -> tuple[str, ...]:
    """The names of the learner's functions a request file asks for, read without unpickling anything."""
    return tuple(json.loads(data.partition(b"\n")[0]))


def load_request(data: bytes) -> Request:
    """The request the grader wrote (only ever the grader's file: pickle runs code)."""
    request = _Unpickler(io.BytesIO(data.partition(b"\n")[2])).load()
    if not isinstance(request, Request):
        raise TypeError(f"the grader's request file holds a {type(request).__name__}, not a Request")
    return request
