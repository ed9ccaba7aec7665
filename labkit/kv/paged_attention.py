"""Attention over the paged pools: every query row reads its sequence's keys and values through its block table.

Plain PyTorch, so it runs on CPU and CUDA alike. The decode rows are read in their few groups of similar length,
each one ``index_select`` gather into a buffer reused across layers and one ``scaled_dot_product_attention`` call
with the query heads grouped under their KV head; each longer (prefill) row gathers its own blocks
(:func:`rows_attention`, shared with :mod:`labkit.kv.blockwise_attention`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from labkit.kv.attention import attention
from labkit.kv.paged_batch import DecodeGroup, PagedBatch

# decode_rows(q of the one-token rows, k_pool, v_pool, batch) -> their outputs
DecodeRows = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PagedBatch], torch.Tensor]


def paged_attention(
    layer: int, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: PagedBatch
) -> torch.Tensor:
    """Attention for every query row, reading each sequence's keys and values through its block table."""
    return rows_attention(q, k_pool, v_pool, batch, _decode_attention)


def rows_attention(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: PagedBatch, decode_rows: DecodeRows
) -> torch.Tensor:
    """The one-token rows through ``decode_rows(q_decodes, k_pool, v_pool, batch)``; each longer row through its
    own blocks, gathered (in the model's dtype, whatever the pools store) and read by one attention call."""
    if batch.num_decodes == q.shape[0]:  # a pure decode step: nothing else to do
        return decode_rows(q, k_pool, v_pool, batch)
    out = torch.empty_like(q)
    if batch.num_decodes:
        out[: batch.num_decodes] = decode_rows(q[: batch.num_decodes], k_pool, v_pool, batch)
    prefills = zip(batch.sequences[batch.num_decodes :], batch.prefill_blocks, batch.prefill_masks)
    for seq, blocks, mask in prefills:
        keys = k_pool.index_select(0, blocks).flatten(0, 1)[: seq.context_len].to(q.dtype)
        values = v_pool.index_select(0, blocks).flatten(0, 1)[: seq.context_len].to(q.dtype)
        rows = slice(seq.start, seq.start + seq.num_query)
        out[rows] = attention(q[rows], keys, values, mask)
    return out


def _decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: PagedBatch) -> torch.Tensor:
    """All one-token rows: per group, gather the padded block tables, mask the padding, one SDPA call."""
    if len(batch.decode_groups) == 1:
        return _group_attention(q, k_pool, v_pool, batch.decode_groups[0], batch.scratch)
    out = torch.empty_like(q)
    for group in batch.decode_groups:
        out[group.start : group.stop] = _group_attention(
            q[group.start : group.stop], k_pool, v_pool, group, batch.scratch
        )
    return out


def _group_attention(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, group: DecodeGroup, scratch: dict
) -> torch.Tensor:
    """One group of decode rows: gather their blocks into reused buffers, then one SDPA call."""
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_pool.shape
    group_size = num_heads // kv_heads
    keys = torch.index_select(k_pool, 0, group.blocks, out=scratch_buffer(scratch, "k", k_pool, group.blocks.numel()))
    values = torch.index_select(v_pool, 0, group.blocks, out=scratch_buffer(scratch, "v", v_pool, group.blocks.numel()))
    # [seqs, tokens, kv_heads, D] -> [seqs, kv_heads, tokens, D]; queries [seqs, kv_heads, group, D]
    keys = keys.view(num_seqs, -1, kv_heads, head_dim).transpose(1, 2)
    values = values.view(num_seqs, -1, kv_heads, head_dim).transpose(1, 2)
    grouped = q.reshape(num_seqs, kv_heads, group_size, head_dim)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=group.mask)
    return out.reshape(num_seqs, num_heads, head_dim)


def scratch_buffer(scratch: dict, name: str, pool: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """The first ``num_blocks`` blocks of a buffer shaped and typed like ``pool``'s blocks, kept across layers
    in ``scratch`` under ``name`` (grown when too small)."""
    buffer = scratch.get(name)
    if buffer is None or buffer.shape[0] < num_blocks or buffer.dtype != pool.dtype:
        buffer = scratch[name] = pool.new_empty((num_blocks, *pool.shape[1:]))
    return buffer[:num_blocks]
