"""Comparison helpers for checks: find the *first* place a learner's output differs.

A learner fixes a bug faster from "position 4: expected token 318, got 262" than
from "assertion failed", so each helper names the first differing index (with
axis names such as layer/position/head when the caller gives them) and recognises
a few common mistakes (axes transposed, output shifted by one position).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from labkit.grading.result import Mismatch


def describe_index(index: Sequence[int], dims: Sequence[str] | None = None) -> str:
    """Where an element sits: layer 3, position 5 when the axes have names, else index [3, 5]."""
    if dims and len(dims) == len(index):
        return ", ".join(f"{name} {value}" for name, value in zip(dims, index))
    return f"index {list(index)}"


def _describe_shape(shape: Sequence[int], dims: Sequence[str] | None) -> str:
    if dims and len(dims) == len(shape):
        return "(" + ", ".join(f"{name}={size}" for name, size in zip(dims, shape)) + ")"
    return str(tuple(shape))


def _not_shaped_like(expected: torch.Tensor, got: Any, dims: Sequence[str] | None, what: str) -> Mismatch:
    """What to say of an answer that is no tensor, or a tensor of another shape."""
    if not isinstance(got, torch.Tensor):
        return Mismatch(
            f"the {what} should be a torch.Tensor of shape {_describe_shape(expected.shape, dims)}, "
            f"but it is a {type(got).__name__}",
            hint="Return a torch.Tensor (not a list, NumPy array or Python number).",
        )
    hint = None
    if got.dim() >= 2 and sorted(got.shape) == sorted(expected.shape):
        hint = "The sizes are right but in the wrong order: check which axis is which (a transpose or a wrong reshape)."
    return Mismatch(
        f"the {what} has shape {_describe_shape(got.shape, None)}, expected {_describe_shape(expected.shape, dims)}",
        hint=hint,
    )


def compare_tensors(
    expected: torch.Tensor,
    got: Any,
    *,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    dims: Sequence[str] | None = None,
    what: str = "output",
) -> Mismatch | None:
    """None when `got` matches `expected` within tolerance, else the first differing element.

    `dims` names the axes ("layer", "position", ...) so the message can say where;
    integer and boolean tensors must match exactly.
    """
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return _not_shaped_like(expected, got, dims, what)
    exact = not (expected.dtype.is_floating_point or expected.dtype.is_complex)
    if exact and (got.dtype.is_floating_point or got.dtype.is_complex):
        return Mismatch(
            f"the {what} has dtype {got.dtype}, expected {expected.dtype}",
            hint="This output holds whole numbers (token ids, counts, flags): keep an integer or bool dtype.",
        )
    if exact:
        close = got.to(expected.dtype) == expected
    else:
        close = torch.isclose(got.double(), expected.double(), rtol=rtol, atol=atol)
    if bool(close.all()):
        return None
    wrong = ~close
    first = tuple(int(i) for i in wrong.nonzero()[0].tolist())
    expected_value, got_value = expected[first].item(), got[first].item()
    summary = f"{int(wrong.sum())} of {wrong.numel()} values differ"
    if not exact:
        largest = (got.double() - expected.double()).abs().nan_to_num(nan=float("inf")).max().item()
        summary += f"; largest difference {largest:.3g}, tolerance atol={atol:g} rtol={rtol:g}"
    hint = None
    if not exact and bool(torch.isfinite(expected).all()) and not bool(torch.isfinite(got).all()):
        hint = (
            "Your output contains nan or inf where every expected value is finite: "
            "look for an overflow (exp of a large number) or a division by zero."
        )
    return Mismatch(
        f"{what} at {describe_index(first, dims)}: expected {expected_value:.6g}, got {got_value:.6g} ({summary})",
        hint=hint,
    )


def compare_tokens(
    expected: Sequence[int],
    got: Any,
    *,
    what: str = "tokens",
    decode: Callable[[int], str] | None = None,
) -> Mismatch | None:
    """None when the token lists are equal, else the first differing position.

    `decode` (token id -> text) makes the message show the text of each token.
    A 1-D integer tensor is accepted for `got`. An output that is the expected one
    shifted by one position is recognised and named in the hint.
    """
    if isinstance(got, torch.Tensor) and got.dim() == 1 and not got.dtype.is_floating_point:
        got = got.tolist()
    if not isinstance(got, (list, tuple)) or not all(isinstance(t, int) for t in got):
        return Mismatch(
            f"the {what} should be a list of token ids (ints), but got a {type(got).__name__}",
            hint="Return a plain list of ints, e.g. tensor.tolist().",
        )
    expected, got = list(expected), list(got)
    if expected == got:
        return None

    def show(token: int) -> str:
        return f"{token} ({decode(token)!r})" if decode else str(token)

    position = next((i for i, (e, g) in enumerate(zip(expected, got)) if e != g), min(len(expected), len(got)))
    if position == len(got):
        return Mismatch(
            f"{what}: got {len(got)}, expected {len(expected)}; the first missing one is at "
            f"position {position}: {show(expected[position])}",
            hint="Your loop stops too early: check the stop condition and the number of steps.",
        )
    if position == len(expected):
        return Mismatch(
            f"{what}: got {len(got)}, expected {len(expected)}; the first extra one is at "
            f"position {position}: {show(got[position])}",
            hint="Your loop runs too long: check the stop condition and the number of steps.",
        )
    hint = None
    if _runs_one_ahead(got[position:], expected[position:]):
        hint = "From here your tokens run one position ahead of the expected ones: a token was skipped (off by one)."
    elif _runs_one_ahead(expected[position:], got[position:]):
        hint = (
            "From here your tokens run one position behind the expected ones: "
            "a token was repeated or inserted (off by one)."
        )
    return Mismatch(
        f"{what} at position {position}: expected {show(expected[position])}, got {show(got[position])}",
        hint=hint,
    )


def _runs_one_ahead(leader: list[int], follower: list[int]) -> bool:
    """True when `leader` continues as `follower` shifted left by one, over at least two tokens."""
    overlap = min(len(leader), len(follower) - 1)
    return overlap >= 2 and leader[:overlap] == follower[1 : overlap + 1]


def compare_sequences(
    expected: Sequence[Any],
    got: Any,
    compare_item: Callable[[Any, Any], Mismatch | None],
    *,
    item: str = "step",
) -> Mismatch | None:
    """Compare two lists item by item (e.g. logits at every decode step); report the first bad item."""
    if not isinstance(got, (list, tuple)):
        return Mismatch(f"expected a list with one entry per {item}, but got a {type(got).__name__}")
    if len(got) != len(expected):
        return Mismatch(f"expected {len(expected)} entries (one per {item}), got {len(got)}")
    for index, (want, have) in enumerate(zip(expected, got)):
        mismatch = compare_item(want, have)
        if mismatch is not None:
            return mismatch.within(f"{item} {index}")
    return None
