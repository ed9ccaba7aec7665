"""Whether a submission's Triton kernels ran compiled or interpreted, as its own kernel saw it.

After the exercises ran, the grader asks the kernel what it had: whether CUDA was available (and
the card's name), and whether TRITON_INTERPRET=1 was set (labkit sets it where there is no CUDA,
labkit/kernels/runtime.py: kernels are compiled exactly where CUDA is available and it is not set).
Each report and the class summary record the answer; a kernel that never imported torch ran none, and
says nothing. It is the kernel's word, so it is information (did `--gpu` reach this submission?), not
evidence, and decides no points.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from labkit.grading.untrusted_file import UntrustedFileRefused, read_untrusted

COMPILED = "compiled"
INTERPRETED = "interpreted"
MAX_FILE_BYTES = 4 << 10
MAX_NAME_CHARS = 100  # a card's name is far shorter; caps a tampered file
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9 ._()/+-]")  # what no card's name holds: no markup, no line breaks


@dataclass(frozen=True)
class KernelDevice:
    """What the kernel said: how its Triton kernels ran, and the CUDA card it saw (None: none)."""

    kernels: str  # COMPILED or INTERPRETED
    cuda_device: str | None

    def describe(self) -> str:
        """In words, for a report: "compiled on NVIDIA H100 80GB HBM3", "interpreted (no CUDA in the kernel)"."""
        if self.kernels == COMPILED:
            return f"compiled on {self.cuda_device}"
        if self.cuda_device:
            return f"interpreted (TRITON_INTERPRET=1, though CUDA showed {self.cuda_device})"
        return "interpreted by Triton on the CPU (no CUDA in the kernel)"


def save_kernel_device(path: str) -> None:
    """In the kernel: write what it has (CUDA's card, TRITON_INTERPRET) as JSON to `path`; nothing where the
    kernel never imported torch, so ran no Triton kernel (importing it here would cost seconds to say so)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    cuda = torch.cuda.is_available()
    with open(path, "w") as file:
        json.dump(
            {
                "cuda_device": torch.cuda.get_device_name() if cuda else None,
                "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
            },
            file,
        )


def kernel_device_code(path: str) -> str:
    """The code the grader sends to the kernel, after the exercises ran, to learn what it had."""
    return (
        "import labkit.grading.kernel_device as _labkit_kernel_device\n"
        f"_labkit_kernel_device.save_kernel_device({path!r})\n"
        "del _labkit_kernel_device\n"
    )


def read_kernel_device(path: Path) -> KernelDevice | None:
    """What the kernel wrote to `path`, or None where it wrote nothing usable (read as any file from a
    submission is: :mod:`labkit.grading.untrusted_file`)."""
    path = Path(path)
    try:
        data = json.loads(read_untrusted(path.parent, path.name, MAX_FILE_BYTES) or b"null")
    except (OSError, ValueError, UntrustedFileRefused):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("triton_interpret"), bool):
        return None
    name = data.get("cuda_device")
    if name is None:
        return KernelDevice(INTERPRETED, None)
    if not isinstance(name, str):
        return None
    name = _NOT_IN_A_NAME.sub("?", name[:MAX_NAME_CHARS]).strip() or "a CUDA device"
    return KernelDevice(INTERPRETED if data["triton_interpret"] else COMPILED, name)


class _Graded(Protocol):
    name: str
    kernels: str | None
    cuda_device: str | None


def kernels_summary(grades: Sequence[_Graded]) -> str | None:
    """The class summary's line: in how many submissions the kernels ran compiled (on which cards) or
    interpreted, and which ran interpreted where others ran compiled; None where no kernel said."""
    compiled = Counter(grade.cuda_device for grade in grades if grade.kernels == COMPILED)
    interpreted = [grade.name for grade in grades if grade.kernels == INTERPRETED]
    if not compiled and not interpreted:
        return None
    parts = []
    if compiled:
        cards = ", ".join(f"{count} on {card}" for card, count in compiled.most_common())
        parts.append(f"compiled in {compiled.total()} ({cards})")
    if interpreted:
        shown = ", ".join(interpreted[:10]) + (f" and {len(interpreted) - 10} more" if len(interpreted) > 10 else "")
        parts.append(f"interpreted in {len(interpreted)}" + (f": {shown}" if compiled else ""))
    silent = len(grades) - compiled.total() - len(interpreted)
    if silent:
        parts.append(f"not reported by {silent}")
    return "Triton kernels, as each submission's kernel reported: " + "; ".join(parts)
