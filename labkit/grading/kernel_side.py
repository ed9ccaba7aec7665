"""The grader's agent inside a submission's kernel: run one exercise and hand back the outputs.

After the notebook has run, the grader writes one exercise's request (its inputs, never
the seed: `request.py`) into the submission's folder and sends a line calling
`save_attempt` with that file and a fresh file path it chose. This runs the learner's
functions on those inputs and writes the outcome as plain data with torch.save. It
decides nothing: the grader loads the file in its own process and compares with its own
oracle, so patching this module earns nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

from labkit.grading.hint_counts import hints_shown
from labkit.grading.request import load_request


def save_attempt(request_path: str, result_path: str, namespace: Mapping[str, Any]) -> None:
    """Run the request's learner functions from `namespace` and torch.save the outcome to `result_path`."""
    with open(request_path, "rb") as file:
        request = load_request(file.read())
    torch.save(request.attempt(namespace).to_record(), result_path)


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


def attempt_code(request_path: str, result_path: str) -> str:
    """The code the grader sends to the kernel for one exercise (runs in the notebook's namespace)."""
    return (
        "import labkit.grading.kernel_side as _labkit_kernel_side\n"
        f"_labkit_kernel_side.save_attempt({request_path!r}, {result_path!r}, globals())\n"
        "del _labkit_kernel_side\n"
    )
