"""The grader's agent inside a submission's kernel: run one exercise and hand back the outputs.

After the notebook has run, the grader writes one exercise's request (its inputs, never
the seed: `request.py`) into the submission's folder and sends a line calling
`save_attempt` with that file and a fresh file path it chose. This runs the learner's
functions on those inputs and writes the outcome as plain data: JSON where JSON holds it
exactly, else with torch.save. It decides nothing: the grader loads the file in its own
process and compares with its own oracle, so patching this module earns nothing.

It imports torch only where the work needs it (the request's inputs or the outputs hold tensors):
a kernel whose notebook never needed torch does not spend seconds importing it here.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any

from labkit.grading.attempt import Attempt, functions_in
from labkit.grading.hint_counts import hints_shown
from labkit.grading.request import load_request, requested_functions


def save_attempt(request_path: str, result_path: str, namespace: Mapping[str, Any]) -> None:
    """Run the request's learner functions from `namespace` and save the outcome to `result_path`; a function
    missing is found before the request's inputs are loaded."""
    with open(request_path, "rb") as file:
        data = file.read()
    found = functions_in(requested_functions(data), namespace)
    attempt = found if isinstance(found, Attempt) else load_request(data).attempt(namespace)
    with open(result_path, "wb") as file:
        file.write(record_bytes(attempt.to_record()))


def record_bytes(record: dict[str, Any]) -> bytes:
    """The result file's bytes: JSON if it holds the record exactly (no tensor, tuple or nan), else torch.save."""
    try:
        text = json.dumps(record, allow_nan=False)
        if json.loads(text) == record:
            return text.encode()
    except (TypeError, ValueError, RecursionError):  # a tensor, a nan, nested deeper than JSON goes
        pass
    import torch  # the record holds something only torch.save keeps

    buffer = io.BytesIO()
    torch.save(record, buffer)
    return buffer.getvalue()


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
