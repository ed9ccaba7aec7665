"""The paged KV cache: a K and a V pool of blocks per layer, written through the step's slots, read by attention.

Every layer has one K pool and one V pool shaped [num_blocks, block_size, kv_heads, head_dim].
:meth:`PagedKVCache.attend` takes the step's :class:`~labkit.kv.paged_batch.PagedBatch` as an
argument, writes the step's new K/V into their slots (one ``index_copy_`` per layer), then calls an
attention function such as :func:`~labkit.kv.paged_attention.paged_attention` that gathers each
sequence's blocks. The batch is never stored on the cache, so a pass that fails leaves nothing
stale behind for the next one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from labkit.kv.blockwise_attention import blockwise_attention, can_walk_blocks
from labkit.kv.fp8 import as_bytes, dequantize_fp8, kv_storage_dtype, quantize_fp8
from labkit.kv.paged_attention import paged_attention
from labkit.kv.paged_batch import PagedBatch, compact_batch


class PagedKVCache:
    """A K and a V pool per layer, plus the ``attend`` callback the model's forward pass calls.

    ``dtype`` is the model's: what attention computes in. ``kv_cache_dtype`` is vLLM's setting for what
    the pools store: "auto" (the model's dtype), "bfloat16" (each value rounded to bf16, 2 bytes) or "fp8"
    (``torch.float8_e4m3fn``, 1 byte per value).

    With "fp8", ``write`` stores ``clamp(x / scale, ±448)`` cast to e4m3, with one scale per layer for K
    (``k_scale[layer]``) and one for V (``v_scale[layer]``). They are 1.0, as in vLLM when no calibrated
    scales are loaded (``--calculate-kv-scales`` off): fixed scales keep every request's cached values
    independent of whoever came first (a scale taken from the first prefill would make a prompt's
    answer depend on the prompt before it, and any later outlier beyond it would be clipped). On the
    default model K stays within ±20 and V within ±11, far inside ±448, so nothing is clipped; what
    is lost is e4m3's precision: 3 mantissa bits, a relative error of at most 1/16 (half a step) from
    2^-6 up, and an absolute one of at most 2^-10 below (the subnormals; about half the values of the
    default model's first-layer V sit there). Set the scales before the first write to change them.

    Attention never sees fp8: :meth:`attend` widens the blocks the step's sequences hold (their whole block
    tables) into a pool of just those blocks, and passes a batch renumbered into it
    (:func:`~labkit.kv.paged_batch.compact_batch`), so a learner's attention runs unchanged. A bfloat16 pool
    under a wider model goes the same way, except to labkit's own attention on a CPU
    (:attr:`reads_pools_directly`), where :func:`~labkit.kv.blockwise_attention.blockwise_attention` reads the
    bfloat16 pools themselves, widening only what it reads.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        attention_fn: Callable[..., torch.Tensor] = paged_attention,  # see labkit.engine.interfaces.Attention
        kv_cache_dtype: str = "auto",
    ):
        self.dtype, self.kv_cache_dtype = dtype, kv_cache_dtype
        self.storage_dtype = kv_storage_dtype(kv_cache_dtype, dtype)
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        # zeros, not empty: padding slots are masked out, but 0 × NaN garbage would still be NaN
        self.k = [torch.zeros(shape, device=device, dtype=self.storage_dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=self.storage_dtype) for _ in range(num_layers)]
        self.k_scale = [1.0] * num_layers  # fp8 only: stored value = K / k_scale[layer]
        self.v_scale = [1.0] * num_layers
        self.num_blocks, self.block_size = num_blocks, block_size
        self.attention_fn = attention_fn
        self.reads_pools_directly = (
            self.storage_dtype == torch.bfloat16
            and attention_fn in (paged_attention, blockwise_attention)
            and can_walk_blocks(torch.device(device))
        )

    @property
    def quantized(self) -> bool:
        """Whether the pools store fewer bits than the model computes in ("fp8", or "bfloat16" under fp32)."""
        return self.storage_dtype != self.dtype

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store this step's new K/V [T, kv_heads, D] into their slots, in the pools' storage dtype."""
        if self.storage_dtype == torch.bfloat16:
            k, v = k.to(self.storage_dtype), v.to(self.storage_dtype)
        elif self.quantized:
            k = quantize_fp8(k, self.k_scale[layer])
            v = quantize_fp8(v, self.v_scale[layer])
        # as bytes: CPU torch has no index_copy_ for float8, and a byte copy is the same copy
        as_bytes(self.k[layer]).view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, as_bytes(k))
        as_bytes(self.v[layer]).view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, as_bytes(v))

    def read(self, layer: int, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V of ``blocks`` [n] of ``layer``, [n, block_size, kv_heads, D] in the model's dtype."""
        k = as_bytes(self.k[layer]).index_select(0, blocks).view(self.storage_dtype)
        v = as_bytes(self.v[layer]).index_select(0, blocks).view(self.storage_dtype)
        if self.storage_dtype != torch.float8_e4m3fn:  # the model's dtype, or bf16, which a wider dtype holds exactly
            return k.to(self.dtype), v.to(self.dtype)
        return dequantize_fp8(k, self.k_scale[layer], self.dtype), dequantize_fp8(v, self.v_scale[layer], self.dtype)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PagedBatch) -> torch.Tensor:
        """Write one step's new K/V, then attend through the pool; bind ``batch`` to get ``model.forward``'s
        ``attend`` callback (``functools.partial(cache.attend, batch=batch)``)."""
        self.write(layer, k, v, batch.slot_mapping)
        if not self.quantized:
            return self.attention_fn(layer, q, self.k[layer], self.v[layer], batch)
        if self.reads_pools_directly:
            return blockwise_attention(layer, q, self.k[layer], self.v[layer], batch)
        view = batch.scratch.get("kv_cache_view")  # built once per step, shared by all layers
        if view is None:
            view = batch.scratch["kv_cache_view"] = compact_batch(batch, self.block_size)
        blocks, compact = view
        k_pool, v_pool = self.read(layer, blocks)
        return self.attention_fn(layer, q, k_pool, v_pool, compact)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)
