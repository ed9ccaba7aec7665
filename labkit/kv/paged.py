"""The paged KV cache: block pools per layer, and attention that reads through block tables.

Every layer has one K pool and one V pool shaped [num_blocks, block_size, kv_heads, head_dim].
A token's K/V live in *slot* ``block * block_size + offset``; a sequence's block table says
which blocks are its own, in order. The engine describes each step once in a
:class:`PagedBatch` (slots to write, tables to read, masks), and every layer reuses it:
:meth:`PagedKVCache.attend` takes it as an argument, writes the step's new K/V into their
slots, then calls an attention function such as :func:`paged_attention` that gathers each
sequence's blocks. The batch is never stored on the cache, so a pass that fails leaves
nothing stale behind for the next one.

Plain PyTorch, so it runs on CPU and CUDA alike. Speed comes from doing the bookkeeping
once per step (not per layer), from one ``index_copy_`` write per layer, and from reading
the single-token (decode) rows in a few groups of similar length: each group is one
``index_select`` gather into a reused buffer, padded to its longest member, and one
``scaled_dot_product_attention`` call with the query heads grouped under their KV head.
Grouping matters once contexts differ: one group padded to the longest of 64 chat
contexts would gather and attend over about twice the tokens that are really there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from labkit.device import available_ram_bytes
from labkit.kv.attention import attention, causal_mask

# Without a GPU there is no "device memory" to take a fraction of; the pool takes a fraction of
# the RAM available, but never more than this (vLLM's CPU backend also uses a fixed KV space).
CPU_KV_CACHE_CAP_BYTES = 1024**3

# One more decode group costs a gather and an attention call per layer: about as long, on the
# CPU this was tuned on, as reading this many padded blocks.
GROUP_COST_BLOCKS = 32


@dataclass
class SequenceSlice:
    """One sequence's part of the flat batch: rows [start, start + num_query) of q/k/v."""

    start: int
    num_query: int
    context_len: int  # tokens cached after this step: earlier ones plus this step's
    block_table: list[int]


@dataclass
class DecodeGroup:
    """Decode rows [start, stop), read with one gather: block tables padded to one width, and a mask."""

    start: int
    stop: int
    blocks: torch.Tensor  # [(stop - start) * width] the rows' block tables, padded with block 0, flat
    mask: torch.Tensor  # [stop - start, 1, 1, width * block_size] additive: 0 visible, -inf padding


def group_rows(widths: list[int], group_cost: int = GROUP_COST_BLOCKS) -> list[tuple[int, int]]:
    """Cut rows into runs [start, stop), each padded to its widest row, at the least total cost.

    A run of r rows whose widest is w blocks gathers r x w blocks, and every run costs
    ``group_cost`` blocks more; dynamic programming finds the cheapest cuts. Cutting between
    two rows of equal width never pays, so only the places where the width changes are
    tried (a handful when rows come sorted, as the runner sends them, longest first).
    Any order is correct; sorted rows pad least.
    """
    row_widths = np.asarray(widths, dtype=np.int64)
    cuts = np.concatenate([[0], np.flatnonzero(np.diff(row_widths)) + 1, [len(widths)]]) if len(widths) else [0]
    best = np.zeros(len(cuts))  # best[j]: the cheapest way to read rows [0, cuts[j])
    last_run_from = np.zeros(len(cuts), dtype=np.int64)  # ... whose last run starts at cuts[last_run_from[j]]
    for j in range(1, len(cuts)):
        starts = np.asarray(cuts[:j])
        widest = np.maximum.accumulate(row_widths[cuts[j] - 1 :: -1])[::-1][starts]  # max(widths[start:cuts[j]])
        costs = best[:j] + (cuts[j] - starts) * widest + group_cost
        last_run_from[j] = np.argmin(costs)
        best[j] = costs[last_run_from[j]]
    runs, j = [], len(cuts) - 1
    while j > 0:
        runs.append((int(cuts[last_run_from[j]]), int(cuts[j])))
        j = int(last_run_from[j])
    return runs[::-1]


@dataclass
class PagedBatch:
    """Everything attention needs about one step, built once and shared by all layers.

    Rows of the flat batch are ordered with single-token sequences (decodes) first.
    """

    slot_mapping: torch.Tensor  # [T] slot of each new token
    sequences: list[SequenceSlice]
    num_decodes: int  # the first num_decodes sequences have one query row
    decode_groups: list[DecodeGroup]  # those rows, in runs of similar length
    prefill_blocks: list[torch.Tensor]  # per longer sequence: the blocks it reads
    prefill_masks: list[torch.Tensor]  # per longer sequence: causal mask [num_query, context_len]
    scratch: dict = field(default_factory=dict)  # gather buffers reused across layers

    @classmethod
    def build(
        cls, sequences: list[SequenceSlice], block_size: int, device: torch.device, dtype: torch.dtype
    ) -> "PagedBatch":
        """Slots, padded tables and masks for one step; ``sequences`` must list decodes first."""
        slots = []
        for seq in sequences:
            first = seq.context_len - seq.num_query
            for pos in range(first, seq.context_len):
                slots.append(seq.block_table[pos // block_size] * block_size + pos % block_size)
        num_decodes = 0
        while num_decodes < len(sequences) and sequences[num_decodes].num_query == 1:
            num_decodes += 1
        if any(seq.num_query == 1 for seq in sequences[num_decodes:]):
            raise ValueError("list single-token sequences before the others in a PagedBatch")
        decodes = sequences[:num_decodes]
        widths = [-(-seq.context_len // block_size) for seq in decodes]
        groups = [
            _decode_group(decodes[start:stop], start, block_size, device, dtype) for start, stop in group_rows(widths)
        ]
        prefills = sequences[num_decodes:]
        prefill_blocks = [
            torch.tensor(seq.block_table[: -(-seq.context_len // block_size)], device=device) for seq in prefills
        ]
        prefill_masks = [causal_mask(seq.num_query, seq.context_len, device) for seq in prefills]
        return cls(
            torch.tensor(slots, dtype=torch.long).to(device),
            sequences,
            num_decodes,
            groups,
            prefill_blocks,
            prefill_masks,
        )


def _decode_group(
    decodes: list[SequenceSlice], start: int, block_size: int, device: torch.device, dtype: torch.dtype
) -> DecodeGroup:
    """Pad these rows' block tables to the widest and mask the padding (built on the CPU, then moved)."""
    width = max(-(-seq.context_len // block_size) for seq in decodes)
    padded = [seq.block_table[:width] + [0] * (width - len(seq.block_table[:width])) for seq in decodes]
    lengths = torch.tensor([seq.context_len for seq in decodes])
    visible = torch.arange(width * block_size)[None, :] < lengths[:, None]
    mask = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, float("-inf"))
    return DecodeGroup(
        start,
        start + len(decodes),
        torch.tensor(padded, dtype=torch.long).flatten().to(device),
        mask[:, None, None, :].to(device),
    )


# attention_fn(layer, q [T,Hq,D], k_pool, v_pool, batch) -> [T,Hq,D]
AttentionFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, PagedBatch], torch.Tensor]


def paged_attention(
    layer: int, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: PagedBatch
) -> torch.Tensor:
    """Attention for every query row, reading each sequence's keys and values through its block table."""
    if batch.num_decodes == q.shape[0]:  # a pure decode step: nothing else to do
        return _decode_attention(q, k_pool, v_pool, batch)
    out = torch.empty_like(q)
    if batch.num_decodes:
        out[: batch.num_decodes] = _decode_attention(q[: batch.num_decodes], k_pool, v_pool, batch)
    prefills = zip(batch.sequences[batch.num_decodes :], batch.prefill_blocks, batch.prefill_masks)
    for seq, blocks, mask in prefills:
        keys = k_pool.index_select(0, blocks).flatten(0, 1)[: seq.context_len]
        values = v_pool.index_select(0, blocks).flatten(0, 1)[: seq.context_len]
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
    keys = torch.index_select(k_pool, 0, group.blocks, out=_buffer(scratch, "k", k_pool, group.blocks.numel()))
    values = torch.index_select(v_pool, 0, group.blocks, out=_buffer(scratch, "v", v_pool, group.blocks.numel()))
    # [seqs, tokens, kv_heads, D] -> [seqs, kv_heads, tokens, D]; queries [seqs, kv_heads, group, D]
    keys = keys.view(num_seqs, -1, kv_heads, head_dim).transpose(1, 2)
    values = values.view(num_seqs, -1, kv_heads, head_dim).transpose(1, 2)
    grouped = q.reshape(num_seqs, kv_heads, group_size, head_dim)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=group.mask)
    return out.reshape(num_seqs, num_heads, head_dim)


def _buffer(scratch: dict, name: str, pool: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """The first ``num_blocks`` blocks of a gather buffer kept across layers (grown when too small)."""
    buffer = scratch.get(name)
    if buffer is None or buffer.shape[0] < num_blocks or buffer.dtype != pool.dtype:
        buffer = scratch[name] = pool.new_empty((num_blocks, *pool.shape[1:]))
    return buffer[:num_blocks]


class PagedKVCache:
    """A K and a V pool per layer, plus the ``attend`` callback the model's forward pass calls."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        attention_fn: AttentionFn = paged_attention,
    ):
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        # zeros, not empty: padding slots are masked out, but 0 × NaN garbage would still be NaN
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.num_blocks, self.block_size = num_blocks, block_size
        self.attention_fn = attention_fn

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store this step's new K/V [T, kv_heads, D] into their slots."""
        self.k[layer].view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k)
        self.v[layer].view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PagedBatch) -> torch.Tensor:
        """Write one step's new K/V, then attend through the pool; bind ``batch`` to get ``model.forward``'s
        ``attend`` callback (``functools.partial(cache.attend, batch=batch)``)."""
        self.write(layer, k, v, batch.slot_mapping)
        return self.attention_fn(layer, q, self.k[layer], self.v[layer], batch)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


def num_blocks_for_memory(
    bytes_per_token: int, block_size: int, device: torch.device, gpu_memory_utilization: float, max_useful_tokens: int
) -> int:
    """How many blocks fit, vLLM style (see :func:`kv_pool_size`, which also says why)."""
    return kv_pool_size(bytes_per_token, block_size, device, gpu_memory_utilization, max_useful_tokens)[0]


def kv_pool_size(
    bytes_per_token: int, block_size: int, device: torch.device, gpu_memory_utilization: float, max_useful_tokens: int
) -> tuple[int, str]:
    """How many blocks fit, vLLM style: a fraction of device memory, less what is in use now; and why, in words.

    On CUDA, the budget is ``gpu_memory_utilization`` × total memory minus what torch already
    holds (the weights), so call it after loading the model. Elsewhere it is that fraction of
    the RAM available now (MemAvailable: page cache the OS would drop counts as available),
    capped at ``CPU_KV_CACHE_CAP_BYTES``. Either way the pool never exceeds ``max_useful_tokens``
    (max_num_seqs × max_model_len): more could never be used.
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    gib = 1024**3
    if device.type == "cuda":
        total = torch.cuda.mem_get_info(device)[1]
        held = torch.cuda.memory_allocated(device)
        budget = gpu_memory_utilization * total - held
        why = f"{gpu_memory_utilization:g} of {total / gib:.1f} GiB of GPU memory less {held / gib:.2f} GiB held"
    else:
        available = available_ram_bytes()
        budget = min(gpu_memory_utilization * available, CPU_KV_CACHE_CAP_BYTES)
        why = f"{gpu_memory_utilization:g} of {available / gib:.1f} GiB of RAM available"
        if budget == CPU_KV_CACHE_CAP_BYTES:
            why += f", capped at {CPU_KV_CACHE_CAP_BYTES / gib:g} GiB on a CPU"
    bytes_per_block = bytes_per_token * block_size
    useful_blocks = -(-max_useful_tokens // block_size)
    num_blocks = min(int(budget // bytes_per_block), useful_blocks)
    if num_blocks < 1:
        raise ValueError(
            f"no room for a single KV block ({bytes_per_block} bytes) with "
            f"gpu_memory_utilization={gpu_memory_utilization}; raise it or pass num_blocks"
        )
    if num_blocks == useful_blocks:
        why = f"enough for max_num_seqs × max_model_len = {max_useful_tokens:,} tokens (room: {why})"
    return num_blocks, f"{num_blocks} blocks of {block_size} tokens × {bytes_per_token:,} bytes: {why}"
