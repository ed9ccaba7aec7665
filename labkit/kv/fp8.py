"""What the KV pools store: vLLM's ``kv_cache_dtype`` setting, and the fp8 round trip that halves a 16-bit pool.

``kv_cache_dtype="fp8"`` stores ``torch.float8_e4m3fn``, one byte per value: the same memory holds twice the
tokens of a 16-bit pool (the scales and their precision: :class:`~labkit.kv.paged_cache.PagedKVCache`).
"""

from __future__ import annotations

import torch

# kv_cache_dtype (vLLM's setting) -> the pools' storage; "auto": the model's dtype (None here). "bfloat16" halves an
# fp32 model's pool: a rounding of each value to bf16, read back exactly (labkit.kv.blockwise_attention reads it as it is)
KV_CACHE_STORAGE: dict[str, torch.dtype | None] = {"auto": None, "bfloat16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
FP8_MAX = 448.0  # the largest finite float8_e4m3fn (it has no infinity)


def kv_storage_dtype(kv_cache_dtype: str, dtype: torch.dtype) -> torch.dtype:
    """What a pool of ``kv_cache_dtype`` ("auto", "bfloat16" or "fp8") stores for a model computing in ``dtype``;
    ``model.config.kv_bytes_per_token(kv_storage_dtype(...))`` is then the pool's bytes per token."""
    if kv_cache_dtype not in KV_CACHE_STORAGE:
        raise ValueError(
            f"kv_cache_dtype must be one of {', '.join(map(repr, KV_CACHE_STORAGE))} "
            f"('auto': the model's dtype, 'bfloat16': 2 bytes per value, 'fp8': float8_e4m3fn, 1 byte per value), "
            f"got {kv_cache_dtype!r}"
        )
    return KV_CACHE_STORAGE[kv_cache_dtype] or dtype


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A 1-byte float (fp8) tensor's storage as uint8, for the copies CPU torch lacks for float8; others as they are."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.is_floating_point() else t


def quantize_fp8(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``x / scale`` as float8_e4m3fn, clamped to its ±448 first, so nothing turns NaN whatever a device's cast does."""
    scaled = x if scale == 1.0 else x / scale
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def dequantize_fp8(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """float8_e4m3fn values back in ``dtype``, times their scale (exactly: every e4m3 value fits ``dtype``).

    On a CPU, torch's own float8 cast is slow (about 10 ns a value on the machine this was tuned on),
    so the bits are moved instead, four times faster: e4m3's sign, 4 exponent bits and 3 mantissa bits
    set in a float16's sign and low bits read 2^-8 times the value, subnormals included (both formats
    put the exponent field's zero at the subnormals), so one multiply by 256 × scale restores it. The
    one difference: e4m3's NaN reads as 480, and the cache never stores NaN unless the model made one.
    """
    if x.device.type != "cpu":
        out = x.to(dtype)
        return out if scale == 1.0 else out.mul_(scale)
    bits = x.view(torch.uint8).to(torch.int16)
    half = ((bits & 0x7F) << 7) | ((bits & 0x80) << 8)
    return half.view(torch.float16).to(dtype).mul_(256.0 * scale)
