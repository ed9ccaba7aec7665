"""The grader's agent inside a submission's kernel: run one exercise and hand back the outputs.

After the notebook has run, the grader sends a line calling `save_attempt` with a
seed it drew itself and a fresh file path it chose. This runs the learner's
functions on inputs from that seed and writes the outcome as plain data with
torch.save. It decides nothing: the grader loads the file in its own process and
compares with its own oracle, so patching this module earns nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

from labkit.grading.attempt import attempt_in_namespace
from labkit.grading.checks import get_exercise
from labkit.grading.hint_counts import hints_shown


def save_attempt(exercise_id: str, seed: int, path: str, namespace: Mapping[str, Any]) -> None:
    """Run the exercise's learner functions from `namespace` and torch.save the outcome to `path`."""
    attempt = attempt_in_namespace(get_exercise(exercise_id), namespace, seed)
    torch.save(attempt.to_record(), path)


def save_hint_counts(path: str) -> None:
    """Write how many hints each exercise showed in this kernel (labkit.hint), as JSON, to `path`."""
    with open(path, "w") as file:
        json.dump(hints_shown(), file)


def hint_counts_code(path: str) -> str:
    """The code the grader sends to the kernel, after the notebook ran, to learn the hint counts."""
    return (
        "import labkit.grading.kernel_side as _labkit_kernel_side\n"
        f"_labkit_kernel_side.save_hint_counts({path!r})\n"
        "del _labkit_kernel_side\n"
    )


def attempt_code(exercise_id: str, seed: int, path: str) -> str:
    """The code the grader sends to the kernel for one exercise (runs in the notebook's namespace)."""
    return (
        "import labkit.grading.kernel_side as _labkit_kernel_side\n"
        f"_labkit_kernel_side.save_attempt({exercise_id!r}, {seed!r}, {path!r}, globals())\n"
        "del _labkit_kernel_side\n"
    )
