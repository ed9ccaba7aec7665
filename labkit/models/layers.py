"""The building blocks of a Llama-family layer, one small function per idea."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Scale each vector to unit root-mean-square (computed in fp32), then by a learned gain."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rope_inverse_frequencies(rope: dict, head_dim: int) -> tuple[torch.Tensor, float]:
    """One rotation speed per pair of dimensions, with the scaling variants these models use.

    Returns (inv_freq [head_dim/2], attention_scaling). ``default`` is the original RoPE;
    ``linear`` stretches positions by a factor; ``llama3`` slows only the low frequencies
    (long wavelengths) and leaves the high ones alone, blending in between.
    """
    base = float(rope.get("rope_theta", 10000.0))
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / float(rope["factor"]), 1.0
    if kind == "llama3":
        return _llama3_scaled(inv_freq, rope), 1.0
    raise NotImplementedError(f"RoPE type {kind!r} is not written out in labkit; supported: default, linear, llama3")


def _llama3_scaled(inv_freq: torch.Tensor, rope: dict) -> torch.Tensor:
    """Llama 3.1's long-context trick: divide slow frequencies by `factor`, keep fast ones."""
    factor, low, high = float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
    original = float(rope["original_max_position_embeddings"])
    wavelength = 2 * math.pi / inv_freq
    slowed = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * slowed / factor + smooth * slowed
    in_between = (wavelength >= original / high) & (wavelength <= original / low)
    return torch.where(in_between, blended, slowed)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each token's rotation angles, [T, head_dim], computed in fp32."""
    angles = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return (angles.cos() * scaling).to(dtype), (angles.sin() * scaling).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (first-half, second-half) pair of x [T, heads, D] by its position's angle."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def swiglu_mlp(x: torch.Tensor, gate_up: Callable, down: Callable) -> torch.Tensor:
    """The feed-forward block: silu(gate) * up, then project down. gate and up are one fused projection."""
    gate, up = gate_up(x).chunk(2, dim=-1)
    return down(F.silu(gate) * up)
