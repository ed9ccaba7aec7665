"""Lab 3, exercise 1: prompts of different lengths laid out as one left-padded rectangle; :func:`padded_layout` is the
course's answer, used in place of the learner's when exercise 3 is graded."""

from __future__ import annotations

from typing import Any

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.compare import compare_tensors
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints


def _pad_inputs(seed: int) -> tuple[list[list[int]], int]:
    """Four prompts of four different lengths, and a pad id that is never 0 (nor any real token's id)."""
    pick = rng(seed)
    lengths = [3, 1, 5] + [pick.choice((2, 4, 6))]
    prompts = [[pick.randint(10, 999) for _ in range(n)] for n in lengths]
    return prompts, pick.randint(2, 9)


def padded_layout(prompts: list[list[int]], pad_id: int, left: bool = True) -> tuple[torch.Tensor, ...]:
    """ids, is_real and positions [B, L] of a padded batch (pads at position 0); left or right padding."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    is_real = torch.zeros(len(prompts), width, dtype=torch.bool)
    positions = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        columns = slice(width - len(prompt), width) if left else slice(0, len(prompt))
        ids[row, columns] = torch.tensor(prompt)
        is_real[row, columns] = True
        positions[row, columns] = torch.arange(len(prompt))
    return ids, is_real, positions


def _pad_oracle(inputs) -> dict[str, Any]:
    prompts, pad_id = inputs
    return {"left": padded_layout(prompts, pad_id), "right": padded_layout(prompts, pad_id, left=False)}


def _compare_pad(expected, got) -> Mismatch | None:
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return Mismatch(
            f"left_pad returned {type(got).__name__}, expected a tuple (ids, is_real, positions)",
            "Return three [B, L] tensors: token ids, a bool mask of real tokens, and positions.",
        )
    (ids, is_real, positions), right = expected["left"], expected["right"]
    got_ids, got_real, got_positions = got
    if isinstance(got_ids, torch.Tensor) and got_ids.shape == ids.shape and torch.equal(got_ids, right[0]):
        return Mismatch(
            "the pads are at the end of each row (right padding)",
            "Pad on the LEFT: then every row's last column holds its last real token, and the next "
            "token of every sequence is predicted from the same column.",
        )
    if isinstance(got_real, torch.Tensor) and got_real.shape == is_real.shape and got_real.dtype != torch.bool:
        return Mismatch(
            f"is_real has dtype {got_real.dtype}, expected torch.bool",
            "is_real is a mask, not a count: make it bool (torch.zeros(B, L, dtype=torch.bool)), so that it can "
            "index and combine with & and ~ as a mask does.",
        )
    for name, want, have in (("ids", ids, got_ids), ("is_real", is_real, got_real)):
        mismatch = compare_tensors(want, have, dims=("row", "column"), what=name)
        if mismatch:
            return mismatch
    if not isinstance(got_positions, torch.Tensor) or got_positions.shape != positions.shape:
        return compare_tensors(positions, got_positions, dims=("row", "column"), what="positions")
    counted_from_row_start = torch.arange(ids.shape[1]).expand_as(ids)
    real_positions = got_positions.where(is_real, torch.zeros_like(got_positions))
    if not torch.equal(real_positions, positions) and torch.equal(
        got_positions.where(is_real, counted_from_row_start), counted_from_row_start
    ):
        return Mismatch(
            "positions count from the start of the row, pads included",
            "A token's position is its index in its own prompt: the first real token is at 0, "
            "however many pads come before it.",
        )
    return compare_tensors(positions, real_positions, dims=("row", "column"), what="position of a real token")


LEFT_PAD = register(
    diagnosed(
        Exercise(
            id="lab3.left_pad",
            functions=("left_pad",),
            answers=("labkit.labs.lab3.padded_layout",),
            make_inputs=_pad_inputs,
            run=lambda functions, inputs: functions[0](*inputs),
            oracle=_pad_oracle,
            compare=_compare_pad,
            tested="left_pad(prompts, pad_id) on 4 prompts of lengths 3, 1, 5 and one more, with a pad id other than "
            "0: ids, is_real (bool) and positions [B, L] (positions of pads are not checked)",
            hint="Rows are as wide as the longest prompt; a shorter prompt sits at the right end of its row, pads on the "
            'left; positions count from each prompt\'s first real token. labkit.hint("lab3.left_pad") shows more.',
        )
    )
)

register_hints(
    "lab3.left_pad",
    "Every row is as wide as the longest prompt. A shorter prompt sits at the right end of its row, so that all "
    "rows end in the same column; the pads fill the left. Positions count from each prompt's own first token.",
    "Start from a [B, L] tensor full of pad_id, and [B, L] zeros for is_real (bool) and positions (long). For each "
    "row, fill its last len(prompt) columns: the prompt's ids, True, and 0 .. len(prompt)-1.",
    "torch.full((B, L), pad_id, dtype=torch.long); torch.zeros(B, L, dtype=torch.bool); for row b, start = L - "
    "len(prompt): ids[b, start:] = torch.tensor(prompt); is_real[b, start:] = True; "
    "positions[b, start:] = torch.arange(len(prompt)).",
)
