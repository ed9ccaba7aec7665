"""What one step tells paged attention, built once and shared by every layer: slots to write, block tables to read.

A token's K/V live in *slot* ``block * block_size + offset`` of a layer's pools. Single-token rows (decodes) come
first, cut into a few groups of similar length (:func:`group_rows`), each padded to its longest member and read
with one gather: one group padded to the longest of 64 chat contexts would read about twice the tokens there are.
:func:`compact_batch` renumbers a batch into a pool of only the blocks its sequences hold (what an fp8 cache hands
attention).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from labkit.kv.attention import causal_mask

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


def compact_batch(batch: PagedBatch, block_size: int) -> tuple[torch.Tensor, PagedBatch]:
    """The blocks ``batch``'s sequences hold (every block of their tables, sorted), and ``batch`` with its
    block numbers renumbered into them: block ``blocks[i]`` becomes block ``i``, so a pool of just those blocks
    reads exactly what the full pool reads (padding, block 0, maps to block 0, masked out as before).
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
