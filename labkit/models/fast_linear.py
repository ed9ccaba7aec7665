"""``F.linear`` with the weight rearranged once, up front, for the CPU's matrix kernels.

A plain ``F.linear`` hands the weight to the BLAS library in its natural row-major layout,
and the library re-tiles it on every call. oneDNN (shipped inside CPU builds of PyTorch) can
do that tiling once: ``torch.ops.mkldnn._reorder_linear_weight`` stores a blocked copy, and
``torch.ops.mkldnn._linear_pointwise`` multiplies by it. On the small matrices of a decode
step that saves much of the time (about 2x at batch 1 on the 2-core machine this course was
built on). These two ops are internal to PyTorch (its compiler uses them) and undocumented,
so this module is the only place that touches them: if they are missing, or the weight is not
on the CPU in fp32/bf16, or ``LABKIT_PREPACK=0`` is set, it falls back to ``F.linear``.
The packed copy sits beside the original weights (the HF model still uses those), so a model
is only packed when a second copy of its weights fits in half the free memory.
"""

from __future__ import annotations

import os
from typing import Callable

import torch
import torch.nn.functional as F

from labkit.device import available_ram_bytes

LinearFn = Callable[[torch.Tensor], torch.Tensor]

# oneDNN chooses its blocked layout for an expected number of input rows; 64 (a full decode batch)
# measured fastest across 1..300 rows here.
PACKING_ROWS_HINT = 64


def prepack_enabled(device: torch.device, dtype: torch.dtype, weight_bytes: int = 0) -> bool:
    """Whether to use oneDNN for weights on this device and dtype, ``weight_bytes`` of them in all."""
    return (os.environ.get("LABKIT_PREPACK", "1") != "0"
            and weight_bytes <= available_ram_bytes() / 2
            and device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def prepacked_linear(weight: torch.Tensor, bias: torch.Tensor | None = None, enabled: bool | None = None) -> LinearFn:
    """Return ``f`` with ``f(x) == F.linear(x, weight, bias)`` (to float rounding), as fast as we can.

    ``enabled`` is the caller's :func:`prepack_enabled` answer for the whole model (asked once).
    """
    if enabled is None:
        enabled = prepack_enabled(weight.device, weight.dtype, weight.numel() * weight.element_size())
    if not enabled:
        return lambda x: F.linear(x, weight, bias)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACKING_ROWS_HINT)
    bias = None if bias is None else bias.detach().contiguous()

    def linear(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != weight.dtype or x.device.type != "cpu":
            return F.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")

    return linear
