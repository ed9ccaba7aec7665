"""A linear layer in int8 (int8 weights times int8 activations) on PyTorch's own int8 kernels.

Lab 10's int8 weights (:func:`labkit.models.quant.quantize_int8`) save bytes only while they are dequantized before
a float matmul; PyTorch's fbgemm and oneDNN kernels (``torch.ops.quantized.linear_dynamic``) also multiply in int8,
accumulating in int32. They quantize the activations with ONE scale for the whole input, so in a server a
request's numbers would depend on which others share its step. labkit quantizes each row (token) with its own
scale ``absmax / 127`` first and appends one guard row holding 127 and -128, so the kernel's own scale is exactly
1 whatever the batch: the int32 sums are exact, and a row's result is the same alone or in a batch.

Which kernels work, if any, is decided by trying, never by CPU name (:func:`try_backend`); which working one
serves, by the model's decode steps timed once per machine (:mod:`labkit.engine.int8_choice`).
Quantized tensors are deprecated in PyTorch (github.com/pytorch/pytorch/issues/184982); when they go, the probe
fails and the server says so and stays unquantized.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from labkit.models.fast_linear import LinearFn
from labkit.models.quant import INT8_MAX, quantize_int8

# Largest error of the probe's product, relative to the product's largest value. Measured here on random
# normal rows and weights: 0.010-0.016 (per-row x per-channel int8, 255 levels each); a kernel whose 16-bit
# sums saturate is off by about 0.5 on the overflow row. 0.05 tells the two apart with room.
TOLERANCE = 0.05
_SMALLEST_SCALE = 1e-12  # an all-zero row still divides by something
# Activation codes per row: ±127 for 8-bit kernels, ±63 where the kernel takes 7 bits (reduce_range). With the
# guard row's -128 (or -64) the kernel's own range is then exactly 255 (127) wide: its scale is 1, and it
# takes the codes as they are, with no second rounding.
ACTIVATION_LEVELS = {False: INT8_MAX, True: 63}


@dataclass(frozen=True)
class Int8Backend:
    """Which quantized engine computes the int8 linears (None: none works here), the dtype the rest of the model
    computes in around them (``activations``: norms, attention, the KV cache), and why, in words."""

    engine: str | None
    reduce_range: bool
    reason: str
    activations: torch.dtype = torch.float32

    @property
    def works(self) -> bool:
        return self.engine is not None

    @property
    def name(self) -> str:
        """The engine, with ``+bf16`` when the model around its linears computes in bf16: a key of the timings."""
        return f"{self.engine}+bf16" if self.activations == torch.bfloat16 else str(self.engine)


@contextlib.contextmanager
def quantized_engine(engine: str) -> Iterator[None]:
    """torch's quantized engine set to ``engine`` for packing, then put back."""
    was = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = was


def int8_linear(weight: torch.Tensor, bias: torch.Tensor | None, backend: Int8Backend) -> LinearFn:
    """``f`` with ``f(x) ≈ F.linear(x, weight, bias)``, computed in int8 by ``backend``'s kernel.

    The weight is quantized per output channel (lab 10's scheme) and packed once; each call quantizes
    every row of ``x`` with its own scale. Float rows in, rows of ``x``'s dtype out.
    """
    if not backend.works:
        raise ValueError(f"no int8 kernel to pack for: {backend.reason}")
    out_features, in_features = weight.shape
    quantized = quantize_int8(weight)
    with warnings.catch_warnings(), quantized_engine(backend.engine):  # type: ignore[arg-type]
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*deprecated")
        codes = torch._make_per_channel_quantized_tensor(
            quantized.codes.cpu(), quantized.scale.double().cpu(), torch.zeros(out_features, dtype=torch.long), 0
        )
        packed = torch.ops.quantized.linear_prepack(codes, None)
    levels = ACTIVATION_LEVELS[backend.reduce_range]
    guard = torch.zeros(1, in_features)
    guard[0, 0], guard[0, 1 % in_features] = levels, -levels - 1
    bias32 = None if bias is None else bias.detach().float()

    def linear(x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, in_features).float()
        absmax = rows.abs().amax(dim=1, keepdim=True)  # exact; vector_norm(ord=inf) took 20x as long on a CPU
        scale = absmax.clamp_min(_SMALLEST_SCALE) / levels
        codes = torch.cat([(rows / scale).round_(), guard])  # whole numbers; the guard fixes the kernel's range
        out = torch.ops.quantized.linear_dynamic(codes, packed, backend.reduce_range)[:-1] * scale
        if bias32 is not None:
            out = out + bias32
        return out.reshape(*x.shape[:-1], out_features).to(x.dtype)

    return linear


def linear_error(linear: LinearFn, weight: torch.Tensor, x: torch.Tensor) -> float:
    """Largest difference from fp32 ``F.linear``, relative to the largest value of that product."""
    expected = F.linear(x.float(), weight)
    return float((linear(x).float() - expected).abs().max() / expected.abs().max())


def _probe_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """A weight and rows for the probe: random ones, plus an all-ones row and output channel, whose
    products are the largest int8 can make (where 16-bit intermediate sums overflow)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 64, generator=generator)
    x = torch.randn(6, 64, generator=generator)
    weight[0], x[0] = 1.0, 1.0
    return weight, x


ENGINE_VARIABLE = "LABKIT_INT8_ENGINE"  # names the one engine to try (still checked), for runs that must match


def candidate_engines() -> list[tuple[str, bool]]:
    """(engine, reduce_range) to try: each engine this torch lists, full 8-bit activations before 7-bit; only
    the engine ``LABKIT_INT8_ENGINE`` names when it is set (the fastest is a race two processes may call apart)."""
    engines = [engine for engine in torch.backends.quantized.supported_engines if engine != "none"]
    pinned = os.environ.get(ENGINE_VARIABLE)
    if pinned:
        if pinned not in engines:
            raise ValueError(f"{ENGINE_VARIABLE}={pinned!r}, but this torch's int8 engines are {', '.join(engines)}")
        engines = [pinned]
    return [(engine, reduce_range) for engine in engines for reduce_range in (False, True)]


def try_backend(
    engine: str, reduce_range: bool, activations: torch.dtype = torch.float32
) -> tuple[Int8Backend | None, str]:
    """The backend if ``engine`` packs, computes within :data:`TOLERANCE` of fp32 on rows in ``activations``'s
    dtype and gives each row the same result alone as in a batch; else None and why not."""
    candidate = Int8Backend(engine, reduce_range, engine, activations)
    weight, x = _probe_inputs()
    x = x.to(activations)
    try:
        linear = int8_linear(weight, None, candidate)
        error = linear_error(linear, weight, x)
        batch_invariant = all(torch.equal(linear(x[i : i + 1])[0], row) for i, row in enumerate(linear(x)))
    except (RuntimeError, NotImplementedError, AttributeError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return None, f"{engine}: {first_line[:120]}"
    if not error <= TOLERANCE:
        return None, f"{engine}{' (7-bit)' if reduce_range else ''}: off by {error:.2f} of the fp32 product"
    if not batch_invariant:
        return None, f"{engine}: a row's product changes with the rows beside it"
    return candidate, ""
