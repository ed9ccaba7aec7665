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

``kv_cache_dtype="fp8"`` (vLLM's setting) stores the pools as ``torch.float8_e4m3fn``, one byte per
value, so the same memory holds twice the tokens of a 16-bit pool (four times those of an fp32 one).
Every value is divided by its layer's scale (one for K, one for V; 1.0 here, vLLM's default for e4m3
when no calibrated scales are loaded) and clamped to e4m3's ±448 before the cast. Attention never sees
fp8: before each layer's attention call the cache gathers the blocks the step's sequences hold,
multiplies them back to the model's dtype and hands the attention function those blocks, as a pool
of their own, with a batch whose block tables are renumbered to match (see :meth:`PagedKVCache.attend`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from labkit.device import available_ram_bytes
from labkit.kv.attention import attention, causal_mask

# Without a GPU there is no "device memory" to take a fraction of; the pool takes a fraction of
# the RAM available, but never more than this (vLLM's CPU backend also uses a fixed KV space).
CPU_KV_CACHE_CAP_BYTES = 1024**3

# kv_cache_dtype (vLLM's setting) -> the pools' storage; "auto": the model's dtype (None here)
KV_CACHE_STORAGE: dict[str, torch.dtype | None] = {"auto": None, "fp8": torch.float8_e4m3fn}
FP8_MAX = 448.0  # the largest finite float8_e4m3fn (it has no infinity)

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
    """A K and a V pool per layer, plus the ``attend`` callback the model's forward pass calls.

    ``dtype`` is the model's: what attention computes in. ``kv_cache_dtype`` is vLLM's setting for what
    the pools store: "auto" (the model's dtype) or "fp8" (``torch.float8_e4m3fn``, 1 byte per value).

    With "fp8", ``write`` stores ``clamp(x / scale, ±448)`` cast to e4m3, with one scale per layer for K
    (``k_scale[layer]``) and one for V (``v_scale[layer]``). They are 1.0, as in vLLM when no calibrated
    scales are loaded (``--calculate-kv-scales`` off): fixed scales keep every request's cached values
    independent of whoever came first (a scale taken from the first prefill would make a prompt's
    answer depend on the prompt before it, and any later outlier beyond it would be clipped). On the
    default model K stays within ±20 and V within ±11, far inside ±448, so nothing is clipped; what
    is lost is e4m3's precision: 3 mantissa bits, a relative error of at most 1/16 (half a step) from
    2^-6 up, and an absolute one of at most 2^-10 below (the subnormals; about half the values of the
    default model's first-layer V sit there). Set the scales before the first write to change them.

    The attention function still receives pools in the model's dtype: :meth:`attend` dequantizes the
    blocks the step's sequences hold (their whole block tables, so any correct attention reads only
    those) into a pool of just those blocks, and passes a batch whose block tables, decode groups,
    prefill blocks and slots are renumbered into it (:func:`compact_batch`). A learner's attention runs
    unchanged; only the block numbers it sees differ from the allocator's. ``k``/``v`` hold the fp8
    pools themselves; :meth:`read` gives blocks of them back in the model's dtype.
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
        attention_fn: AttentionFn = paged_attention,
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

    @property
    def quantized(self) -> bool:
        """Whether the pools store fewer bits than the model computes in (kv_cache_dtype "fp8")."""
        return self.storage_dtype != self.dtype

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store this step's new K/V [T, kv_heads, D] into their slots (as fp8 with kv_cache_dtype "fp8")."""
        if self.quantized:
            k = quantize_fp8(k, self.k_scale[layer])
            v = quantize_fp8(v, self.v_scale[layer])
        # as bytes: CPU torch has no index_copy_ for float8, and a byte copy is the same copy
        _as_bytes(self.k[layer]).view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, _as_bytes(k))
        _as_bytes(self.v[layer]).view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, _as_bytes(v))

    def read(self, layer: int, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V of ``blocks`` [n] of ``layer``, [n, block_size, kv_heads, D] in the model's dtype."""
        if not self.quantized:
            return self.k[layer].index_select(0, blocks), self.v[layer].index_select(0, blocks)
        keys = _as_bytes(self.k[layer]).index_select(0, blocks).view(self.storage_dtype)
        values = _as_bytes(self.v[layer]).index_select(0, blocks).view(self.storage_dtype)
        return dequantize_fp8(keys, self.k_scale[layer], self.dtype), dequantize_fp8(
            values, self.v_scale[layer], self.dtype
        )

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PagedBatch) -> torch.Tensor:
        """Write one step's new K/V, then attend through the pool; bind ``batch`` to get ``model.forward``'s
        ``attend`` callback (``functools.partial(cache.attend, batch=batch)``).

        With an fp8 pool, the attention function gets the step's blocks in the model's dtype and the
        batch renumbered into them (see the class's docstring)."""
        self.write(layer, k, v, batch.slot_mapping)
        if not self.quantized:
            return self.attention_fn(layer, q, self.k[layer], self.v[layer], batch)
        view = batch.scratch.get("kv_cache_view")  # built once per step, shared by all layers
        if view is None:
            view = batch.scratch["kv_cache_view"] = compact_batch(batch, self.block_size)
        blocks, compact = view
        k_pool, v_pool = self.read(layer, blocks)
        return self.attention_fn(layer, q, k_pool, v_pool, compact)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


def kv_storage_dtype(kv_cache_dtype: str, dtype: torch.dtype) -> torch.dtype:
    """What a pool of ``kv_cache_dtype`` ("auto" or "fp8") stores for a model computing in ``dtype``;
    ``model.config.kv_bytes_per_token(kv_storage_dtype(...))`` is then the pool's bytes per token."""
    if kv_cache_dtype not in KV_CACHE_STORAGE:
        raise ValueError(
            f"kv_cache_dtype must be one of {', '.join(map(repr, KV_CACHE_STORAGE))} "
            f"('auto': the model's dtype, 'fp8': float8_e4m3fn, 1 byte per value), got {kv_cache_dtype!r}"
        )
    return KV_CACHE_STORAGE[kv_cache_dtype] or dtype


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


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A float8 tensor's storage as uint8 (for the copies CPU torch lacks for float8); others as they are."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.is_floating_point() else t


def compact_batch(batch: PagedBatch, block_size: int) -> tuple[torch.Tensor, PagedBatch]:
    """The blocks ``batch``'s sequences hold (every block of their tables, sorted), and ``batch`` with its
    block numbers renumbered into them: block ``blocks[i]`` becomes block ``i``.

    What an fp8 cache hands attention: a pool of those blocks in the model's dtype reads, through the
    renumbered tables, exactly what the full pool reads through the original ones. Padding (block 0 in
    the decode groups) maps to block 0 of the compact pool, masked out as before.
    """
    held = sorted({block for seq in batch.sequences for block in seq.block_table})
    device = batch.slot_mapping.device
    blocks = torch.tensor(held, dtype=torch.long, device=device)
    renumber = {block: i for i, block in enumerate(held)}
    lookup = torch.zeros(max(held, default=0) + 1, dtype=torch.long)
    lookup[held] = torch.arange(len(held))
    lookup = lookup.to(device)
    slots = batch.slot_mapping
    return blocks, PagedBatch(
        lookup[slots // block_size] * block_size + slots % block_size,
        [replace(seq, block_table=[renumber[b] for b in seq.block_table]) for seq in batch.sequences],
        batch.num_decodes,
        [replace(group, blocks=lookup[group.blocks]) for group in batch.decode_groups],
        [lookup[table] for table in batch.prefill_blocks],
        batch.prefill_masks,
    )


def num_blocks_for_memory(
    bytes_per_token: int, block_size: int, device: torch.device, gpu_memory_utilization: float, max_useful_tokens: int
) -> int:
    """How many blocks fit, vLLM style (see :func:`kv_pool_size`, which also says why)."""
    return kv_pool_size(bytes_per_token, block_size, device, gpu_memory_utilization, max_useful_tokens)[0]


def kv_pool_size(
    bytes_per_token: int,
    block_size: int,
    device: torch.device,
    gpu_memory_utilization: float,
    max_useful_tokens: int,
    kv_cache_dtype: str = "auto",
) -> tuple[int, str]:
    """How many blocks fit, vLLM style: a fraction of device memory, less what is in use now; and why, in words.

    On CUDA, the budget is ``gpu_memory_utilization`` × total memory minus what torch already
    holds (the weights), so call it after loading the model. Elsewhere it is that fraction of
    the RAM available now (MemAvailable: page cache the OS would drop counts as available),
    capped at ``CPU_KV_CACHE_CAP_BYTES``. Either way the pool never exceeds ``max_useful_tokens``
    (max_num_seqs × max_model_len): more could never be used.

    ``bytes_per_token`` is what the pool stores per token: ``model.config.kv_bytes_per_token(dtype)`` with
    the pool's storage dtype (:func:`kv_storage_dtype`), so an fp8 pool counts 1 byte per value and fits
    twice the tokens of a 16-bit one; ``kv_cache_dtype`` only names it in the reason.
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
    storage = "" if kv_cache_dtype == "auto" else f" ({kv_cache_dtype})"
    return num_blocks, f"{num_blocks} blocks of {block_size} tokens × {bytes_per_token:,} bytes{storage}: {why}"
