"""What a kernel hands back is untrusted: read it bounded, load it safely, accept only plain, small data.

A result file is written by code the learner controls. Before any comparison sees it:

- it is opened without following a symlink and without blocking on a FIFO, must be a
  regular file, and is refused unread if it is larger than the limit;
- it is loaded as JSON, or, where it is torch.save's zip (the kernel writes that only for a record
  JSON cannot hold exactly: tensors, tuples), with `torch.load(weights_only=True)`; neither runs code;
- every value in it is checked: only lists, tuples, dicts with string keys, numbers,
  strings, None and plain tensors (`torch.Tensor` itself, not a subclass; strided, on
  the CPU, an ordinary dtype, contiguous, starting at the start of a storage exactly
  its own size, so no expanded or zero-stride view and no view into a larger buffer);
- the whole is no bigger than a budget drawn from the size of the expected answer.

So the cost of comparing it is bounded by the size of the expected answer, whatever
the file holds.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from labkit.grading.untrusted_file import UntrustedFileRefused, read_untrusted

MAX_DEPTH = 32  # nesting of lists and dicts: deeper than any exercise's output
_DTYPES = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
    }
)
_MIN_BUDGET = (1 << 20, 10_000)  # bytes, values: room for small answers' bookkeeping
_BUDGET_FACTOR = 8  # an exercise's `run` may hand back more than the answer (its inputs, the calls it saw)


class ResultRefused(Exception):
    """The result is not plain, bounded data; the message says what and where, for the learner."""


@dataclass(frozen=True)
class Size:
    """How big a value is: bytes of tensor data and text, and how many values it holds."""

    bytes: int
    values: int


def _check_tensor(tensor: torch.Tensor, where: str) -> None:
    if type(tensor) is not torch.Tensor:
        raise ResultRefused(f"{where} is a {type(tensor).__name__}, a subclass of torch.Tensor; return plain tensors")
    if tensor.layout != torch.strided or tensor.device.type != "cpu" or tensor.dtype not in _DTYPES:
        raise ResultRefused(
            f"{where} is a {tensor.layout} tensor of dtype {tensor.dtype} on {tensor.device}; "
            "return dense CPU tensors of an ordinary dtype"
        )
    own_bytes = tensor.numel() * tensor.element_size()
    if not tensor.is_contiguous() or tensor.storage_offset() != 0 or tensor.untyped_storage().nbytes() != own_bytes:
        raise ResultRefused(
            f"{where} is a view (expanded, strided or part of a larger tensor) of shape {tuple(tensor.shape)}; "
            "return a tensor that owns its data (e.g. .contiguous().clone())"
        )


def measure(value: Any, where: str = "the output", depth: int = 0, *, strict: bool = True) -> Size:
    """The size of plain data; ResultRefused for anything else (or nested deeper than MAX_DEPTH).

    `strict=False` measures the grader's own expected answer: views and other types count, unchecked.
    """
    if depth > MAX_DEPTH:
        raise ResultRefused(f"{where} is nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, torch.Tensor):
        if strict:
            _check_tensor(value, where)
        return Size(value.numel() * value.element_size(), 1)
    if value is None or type(value) in (bool, int, float):
        return Size(8, 1)
    if type(value) is str:
        return Size(len(value), 1)
    if type(value) in (list, tuple):
        items = enumerate(value)
    elif type(value) is dict and all(type(key) is str for key in value):
        items = value.items()
    elif strict:
        raise ResultRefused(f"{where} is a {type(value).__name__}; only tensors, numbers, strings, lists and dicts")
    else:
        return Size(8, 1)
    total = Size(0, 1)
    for key, item in items:
        size = measure(item, f"{where}[{key!r}]", depth + 1, strict=strict)
        total = Size(total.bytes + size.bytes + (len(key) if isinstance(key, str) else 0), total.values + size.values)
    return total


def budget_for(expected: Any) -> Size:
    """The most a result for this expected answer may hold: a few times its size, with a floor."""
    size = measure(expected, "the expected answer", strict=False)
    return Size(max(_MIN_BUDGET[0], _BUDGET_FACTOR * size.bytes), max(_MIN_BUDGET[1], _BUDGET_FACTOR * size.values))


def file_limit(budget: Size) -> int:
    """The largest result file worth reading for this budget (its data plus the file format's overhead)."""
    return budget.bytes + 64 * budget.values + (1 << 20)


def read_result_file(folder: Path, name: str, limit: int) -> bytes | None:
    """The bytes of `folder/name`, or None if there is no such file; ResultRefused if it is not a
    regular file (a symlink, a FIFO, a device) or is larger than `limit` bytes."""
    try:
        return read_untrusted(folder, name, limit, "its answer needs")
    except UntrustedFileRefused as refused:
        raise ResultRefused(f"the result file was refused: {refused}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # the kernel writes nan and infinities with torch.save


def _loaded(data: bytes) -> Any:
    """The record in a result file: torch.save's zip (it starts "PK") or JSON; either loaded without running code."""
    if data.startswith(b"PK"):
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    return json.loads(data, parse_constant=_no_constant)


def load_result(data: bytes, budget: Size) -> Any:
    """Load a result file's bytes without running code, and check that it is plain data within `budget`."""
    try:
        record = _loaded(data)
    except Exception as error:
        if isinstance(error, MemoryError) or "can't allocate memory" in str(error):  # torch's words for it
            raise MemoryError(str(error)) from None
        raise ResultRefused(
            "the result from the kernel could not be loaded safely "
            "(only tensors, numbers, strings and lists are accepted)"
        ) from None
    size = measure(record, "the result")
    if size.bytes > budget.bytes or size.values > budget.values:
        raise ResultRefused(
            f"the result holds {size.bytes:,} bytes in {size.values:,} values, more than the "
            f"{budget.bytes:,} bytes and {budget.values:,} values the expected answer allows"
        )
    return record
