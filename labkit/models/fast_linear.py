"""``F.linear`` with the weight rearranged once, up front, for the CPU's matrix kernels.

A plain ``F.linear`` hands the weight to BLAS in its row-major layout, which it re-tiles on every call. oneDNN
(inside CPU builds of PyTorch) can tile it once (``torch.ops.mkldnn._reorder_linear_weight``) and multiply by the
blocked copy (``_linear_pointwise``): about 2x at batch 1 on the small matrices of a decode step, on the 2-core
machine this course was built on. These ops are internal and undocumented, and whether they work depends on the
CPU, so the choice is made by trying (:func:`probe_prepack`), never by CPU name; ``LABKIT_PREPACK=0`` forces the
plain path. The packed copy sits beside the original weights (the HF model still uses those), so a model is
packed only when a second copy of its weights fits in half the free memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from labkit.device import available_ram_bytes

LinearFn = Callable[[torch.Tensor], torch.Tensor]

# oneDNN chooses its blocked layout for an expected number of input rows; 64 (a full decode batch)
# measured fastest across 1..300 rows here.
PACKING_ROWS_HINT = 64

# Relative tolerance of the probe's comparison with F.linear, per dtype: accumulation order differs.
_PROBE_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


@dataclass(frozen=True)
class MatmulPath:
    """Which kernel path the model's matrix multiplies take, and why (what ``labkit info`` shows)."""

    prepacked: bool
    reason: str

    def describe(self) -> str:
        return "oneDNN prepacked" if self.prepacked else f"plain F.linear ({self.reason})"


_probed: dict[tuple[str, torch.dtype], MatmulPath] = {}


def probe_prepack(device: torch.device, dtype: torch.dtype) -> MatmulPath:
    """Whether oneDNN's packed kernels work here for ``dtype``: tried once per process, then remembered."""
    key = (device.type, dtype)
    if key not in _probed:
        _probed[key] = _try_prepack(device, dtype)
    return _probed[key]


def _try_prepack(device: torch.device, dtype: torch.dtype) -> MatmulPath:
    if device.type != "cpu":
        return MatmulPath(False, f"prepacking is a CPU path; {device.type} runs its own kernels")
    if dtype not in _PROBE_TOLERANCE:
        return MatmulPath(False, f"no packed kernels for {str(dtype).removeprefix('torch.')}")
    if not (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    ):
        return MatmulPath(False, "this torch build has no oneDNN packed-linear ops")
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 32, generator=generator).to(dtype)
    x = torch.randn(5, 32, generator=generator).to(dtype)
    try:
        got = _packed_product(x, _reorder_weight(weight, PACKING_ROWS_HINT), None).float()
    except (RuntimeError, NotImplementedError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return MatmulPath(False, f"oneDNN refused {str(dtype).removeprefix('torch.')} on this CPU: {first_line}")
    expected = F.linear(x, weight).float()
    error = float((got - expected).abs().max() / expected.abs().max())
    if got.shape != expected.shape or not error <= _PROBE_TOLERANCE[dtype]:
        return MatmulPath(False, f"oneDNN's packed product differs from F.linear here (relative error {error:.1e})")
    return MatmulPath(True, "packed kernels tried and matched F.linear on this CPU")


def matmul_path(device: torch.device, dtype: torch.dtype, weight_bytes: int = 0) -> MatmulPath:
    """The path a model of ``weight_bytes`` on this device and dtype takes, with the reason."""
    if os.environ.get("LABKIT_PREPACK", "1") == "0":
        return MatmulPath(False, "LABKIT_PREPACK=0")
    probed = probe_prepack(device, dtype)
    if probed.prepacked and weight_bytes > available_ram_bytes() / 2:
        return MatmulPath(False, "a second, packed copy of the weights would not fit in half the free RAM")
    return probed


def prepacked_linear(weight: torch.Tensor, bias: torch.Tensor | None = None, enabled: bool | None = None) -> LinearFn:
    """Return ``f`` with ``f(x) == F.linear(x, weight, bias)`` (to float rounding), as fast as we can.

    ``enabled`` is the caller's :func:`matmul_path` answer for the whole model (asked once).
    """
    if enabled is None:
        enabled = matmul_path(weight.device, weight.dtype, weight.numel() * weight.element_size()).prepacked
    if not enabled:
        return lambda x: F.linear(x, weight, bias)
    packed = _reorder_weight(weight.detach().contiguous(), PACKING_ROWS_HINT)
    bias = None if bias is None else bias.detach().contiguous()

    def linear(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != weight.dtype or x.device.type != "cpu":
            return F.linear(x, weight, bias)
        return _packed_product(x.contiguous(), packed, bias)

    return linear


def _reorder_weight(weight: torch.Tensor, rows_hint: int) -> torch.Tensor:
    """oneDNN's blocked copy of ``weight``, laid out for about ``rows_hint`` input rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows_hint)


def _packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weightᵀ + bias`` with the packed weight."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
