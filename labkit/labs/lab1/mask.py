"""Lab 1, exercise 1: the causal mask, checked against the math, with the three typical mistakes named."""

from __future__ import annotations

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.compare import compare_sequences, compare_tensors
from labkit.grading.result import Mismatch
from labkit.kv.attention import causal_mask
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints


def _mask_sizes(seed: int) -> tuple[list[int]]:
    return ([1, 2, 5, rng(seed).randint(6, 12)],)


def course_causal_mask(num_tokens: int) -> torch.Tensor:
    """The course's answer to exercise 1, used in place of the learner's when a later exercise is graded."""
    return causal_mask(num_tokens, num_tokens)


def _mask_oracle(inputs) -> dict[str, list[torch.Tensor]]:
    sizes = inputs[0]
    right = [causal_mask(n, n) for n in sizes]
    return {
        "masks": right,
        "future": [m.T.contiguous() for m in right],
        "no_self": [torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1) for n in sizes],
    }


def _compare_masks(expected, got) -> Mismatch | None:
    if isinstance(got, list) and len(got) == len(expected["masks"]):
        for index, (mask, future, no_self) in enumerate(
            zip(expected["masks"], expected["future"], expected["no_self"])
        ):
            mine = got[index]
            if isinstance(mine, torch.Tensor) and mine.shape == mask.shape and mine.dtype == torch.bool:
                if mask.shape[0] > 1 and torch.equal(mine, ~mask):
                    return Mismatch(
                        f"case {index} ({mask.shape[0]} tokens): your mask is True exactly where the key is hidden",
                        "True must mean *may look*: this mask marks the hidden keys (the convention of "
                        "nn.MultiheadAttention's attn_mask). Return the opposite: True where j <= i.",
                    )
                if mask.shape[0] > 1 and torch.equal(mine, future):
                    return Mismatch(
                        f"case {index} ({mask.shape[0]} tokens): row 0 lets the first token see every later token",
                        "You marked the future instead of the past: query i may look at key j when j <= i "
                        "(torch.tril), not j >= i.",
                    )
                if mask.shape[0] > 1 and torch.equal(mine, no_self):
                    return Mismatch(
                        f"case {index} ({mask.shape[0]} tokens): the diagonal is False",
                        "A token must be able to look at itself: use j <= i, not j < i.",
                    )
    return compare_sequences(
        expected["masks"], got, lambda e, g: compare_tensors(e, g, dims=("query", "key"), what="mask"), item="case"
    )


MASK = register(
    diagnosed(
        Exercise(
            id="lab1.causal_mask",
            functions=("causal_mask",),
            answers=("labkit.kv.attention.causal_mask",),
            make_inputs=_mask_sizes,
            run=lambda functions, inputs: [functions[0](n) for n in inputs[0]],
            oracle=_mask_oracle,
            compare=_compare_masks,
            tested="causal_mask(n) for n = 1, 2, 5 and one more: a bool [n, n] tensor, True where query i may see key j",
            hint="Query i may look at keys 0..i and no further: True on and below the diagonal, a bool tensor. "
            'labkit.hint("lab1.causal_mask") shows more.',
        )
    )
)

register_hints(
    "lab1.causal_mask",
    "Query i may look at key j exactly when j is not after i. Draw the T x T grid: the allowed cells are the "
    "diagonal and everything below it.",
    "Start from a T x T grid of True and keep only its lower triangle, diagonal included; the result must be bool.",
    "torch.tril keeps the lower triangle (diagonal included) of a matrix; torch.ones(T, T, dtype=torch.bool) is the "
    "grid to start from.",
)
