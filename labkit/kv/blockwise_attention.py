"""Decode attention over the paged pools without the padded copy, on a CPU: each row's block table walked a few
block positions at a time, every part's softmax merged into a running one, as lab 11's kernel does on a GPU.

:func:`~labkit.kv.paged_attention.paged_attention` copies a group of decode rows' blocks into one buffer padded to the
longest row. Here a group is read in parts of about ``PART_BYTES`` of keys, small enough to stay in the CPU's cache,
by torch's CPU flash-attention kernel, which also returns each query's log-sum-exp. Parts merge exactly: with ``lse``
and ``out`` the running ones, a part (``o``, ``l``) makes ``m = logaddexp(lse, l)`` and
``out = out·e^(lse-m) + o·e^(l-m)``; a row with no key in a part gives it ``l = -inf``, so weight 0. A narrower pool
(``kv_cache_dtype="bfloat16"``) is widened part by part, never whole.

Which one serves is a rule, never a timing at start: an fp32 pool keeps the gather, a bfloat16 pool under an fp32
model is read here. Measured in turns on a 2-core AMD EPYC (AVX2 only): over an fp32 pool neither was faster in every
round, over a bfloat16 pool the walk was, in every round. ``labkit bench --profile --attention gather,blockwise
--kv-cache-dtype auto,bfloat16`` measures all four on any CPU.
"""

from __future__ import annotations

import torch

from labkit.kv.paged_attention import rows_attention, scratch_buffer
from labkit.kv.paged_batch import DecodeGroup, PagedBatch

# The CPU flash-attention kernel that also returns the log-sum-exp; None where this torch has none.
_FLASH_WITH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
# Keys read per part (and as much of values): small beside a server CPU's last-level cache, so a part's copies are
# read back from it; on the CPU this was tuned on, 1 MiB was faster than 256 KiB (fewer calls) and than 4 MiB.
PART_BYTES = 1024 * 1024


def can_walk_blocks(device: torch.device) -> bool:
    """Whether :func:`blockwise_attention` runs here: on a CPU, with torch's CPU flash-attention kernel."""
    return device.type == "cpu" and _FLASH_WITH_LSE is not None


def blockwise_attention(
    layer: int, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: PagedBatch
) -> torch.Tensor:
    """Attention for every query row; the decode rows walk their block tables part by part (pools in the model's
    dtype or narrower), the longer rows as in :func:`~labkit.kv.paged_attention.paged_attention`."""
    if not can_walk_blocks(q.device):
        raise ValueError(
            f"blockwise_attention runs on a CPU (torch's CPU flash-attention kernel); these queries are on {q.device}: "
            "use labkit.kv.paged_attention.paged_attention, or lab 11's kernel (labkit.kernels.paged_decode) on a GPU"
        )
    return rows_attention(q, k_pool, v_pool, batch, _decode_rows)


def _decode_rows(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: PagedBatch) -> torch.Tensor:
    lengths = batch.scratch.get("decode_lengths")  # built once per step, shared by all layers
    if lengths is None:
        decodes = batch.sequences[: batch.num_decodes]
        lengths = batch.scratch["decode_lengths"] = torch.tensor([seq.context_len for seq in decodes])
    out = torch.empty_like(q)
    for group in batch.decode_groups:
        rows = slice(group.start, group.stop)
        out[rows] = _walk_group(q[rows], k_pool, v_pool, group, lengths[rows], batch.scratch)
    return out


def _walk_group(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, group: DecodeGroup, lengths: torch.Tensor, scratch
) -> torch.Tensor:
    """One group of decode rows, read ``PART_BYTES`` of keys at a time, the parts merged by their log-sum-exp."""
    num_rows, num_heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_pool.shape
    width = group.blocks.numel() // num_rows
    table = group.blocks.view(num_rows, width)
    per_part = max(1, PART_BYTES // (num_rows * k_pool[0].nbytes))  # block positions per part
    grouped = q.reshape(num_rows, kv_heads, num_heads // kv_heads, head_dim)
    flash = _FLASH_WITH_LSE
    assert flash is not None  # blockwise_attention checked can_walk_blocks
    out = lse = torch.empty(0)
    for first in range(0, width, per_part):
        last = min(width, first + per_part)
        blocks = table[:, first:last].flatten()
        keys = _read(k_pool, blocks, q.dtype, scratch, "k").view(num_rows, -1, kv_heads, head_dim).transpose(1, 2)
        values = _read(v_pool, blocks, q.dtype, scratch, "v").view(num_rows, -1, kv_heads, head_dim).transpose(1, 2)
        mask = group.mask[..., first * block_size : last * block_size]
        part, part_lse = flash(grouped, keys, values, attn_mask=mask)
        if first == 0:  # every row has a key in the first part
            out, lse = part, part_lse
            continue
        part_lse = part_lse.masked_fill((lengths <= first * block_size)[:, None, None], float("-inf"))
        merged = torch.logaddexp(lse, part_lse)
        out = out * (lse - merged).exp_().unsqueeze(-1) + part * (part_lse - merged).exp_().unsqueeze(-1)
        lse = merged
    return out.reshape(num_rows, num_heads, head_dim)


def _read(pool: torch.Tensor, blocks: torch.Tensor, dtype: torch.dtype, scratch: dict, name: str) -> torch.Tensor:
    """``pool``'s ``blocks`` in ``dtype``, copied into buffers kept across layers (widened there when narrower)."""
    stored = torch.index_select(pool, 0, blocks, out=scratch_buffer(scratch, f"part {name}", pool, blocks.numel()))
    if pool.dtype == dtype:
        return stored
    wide = scratch_buffer(scratch, f"part {name} wide", stored[:0].to(dtype), blocks.numel())
    return wide.copy_(stored)
