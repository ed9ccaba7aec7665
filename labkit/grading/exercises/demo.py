"""A toy lab, "demo": three small exercises that show how to write a check spec.

Each spec names the learner's function, builds inputs from a seed, computes the
expected answer itself (the oracle) and compares with a helper that reports the
first difference. The grader's tests use these exercises; the course's labs follow
the same pattern in `labkit/labs/labN/`.
"""

from __future__ import annotations

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.compare import compare_tensors, compare_tokens


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _two_matrices(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = _generator(seed)
    return torch.randn(3, 4, generator=generator), torch.randn(3, 4, generator=generator)


def _large_scores(seed: int) -> tuple[torch.Tensor]:
    # Scores around 100: exp overflows float32 (above about 88), so a softmax
    # without the max subtraction gives nan.
    return (100 + 5 * torch.randn(4, 7, generator=_generator(seed)),)


def _logits_for_steps(seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(6, 50, generator=_generator(seed)),)


# The course's answers. The oracles use them, and each exercise names its own in `answers`, so a
# learner's function that calls one fails instead of passing (labkit.grading.answers).
def course_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def course_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def course_greedy_tokens(logits: torch.Tensor) -> list[int]:
    return logits.argmax(dim=-1).tolist()


register(
    Exercise(
        id="demo.add",
        functions=("add",),
        make_inputs=_two_matrices,
        oracle=lambda inputs: course_add(*inputs),
        answers=("labkit.grading.exercises.demo.course_add",),
        compare=lambda expected, got: compare_tensors(expected, got, dims=("row", "column"), what="sum"),
        tested="add(a, b) on two random (3, 4) tensors gives their elementwise sum",
        hint="Add the two tensors element by element and return a tensor of the same shape.",
    )
)

register(
    Exercise(
        id="demo.softmax",
        functions=("softmax",),
        make_inputs=_large_scores,
        oracle=lambda inputs: course_softmax(*inputs),
        answers=("labkit.grading.exercises.demo.course_softmax",),
        compare=lambda expected, got: compare_tensors(expected, got, dims=("row", "column"), what="probability"),
        tested="softmax(x) over the last axis of a (4, 7) tensor of large scores matches torch.softmax",
        hint=(
            "Normalise over the last axis only, and subtract each row's maximum before exp "
            "so large scores do not overflow."
        ),
        points=2.0,
    )
)

register(
    Exercise(
        id="demo.greedy_tokens",
        functions=("greedy_tokens",),
        make_inputs=_logits_for_steps,
        oracle=lambda inputs: course_greedy_tokens(*inputs),
        answers=("labkit.grading.exercises.demo.course_greedy_tokens",),
        compare=lambda expected, got: compare_tokens(expected, got),
        tested="greedy_tokens(logits) picks the highest-scoring token id at each of 6 steps",
        hint="Take the argmax over the vocabulary axis (the last one) at every step and return a list of ints.",
    )
)
