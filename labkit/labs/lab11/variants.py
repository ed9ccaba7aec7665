"""The typical wrong kernels of lab 11, simulated in PyTorch, so a check can say which mistake an output shows.

:func:`simulate` walks each sequence's block table block by block as a kernel does, keeping a running softmax, with
one switch per mistake; exponentials are taken in float32's range, as a kernel's are. With every switch off it is
the right answer.
"""

from __future__ import annotations

import math

import torch


def simulate(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    num_splits: int = 1,
    rescale: bool = True,
    subtract_max: bool = True,
    mask_tail: bool = True,
    head_map: str = "group",
    use_table: bool = True,
    block_max: bool = False,
    merge_rescaled: bool = True,
    merge_shifted: bool = True,
) -> torch.Tensor:
    """Decode attention computed the way a kernel walks the blocks, with the mistakes switched on as asked."""
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_pool.shape
    group = num_heads // num_kv_heads
    per_split = -(-block_tables.shape[1] // num_splits)
    out = torch.empty(q.shape, dtype=torch.float64)
    for seq in range(num_seqs):
        length = int(context_lens[seq])
        mistakes = dict(
            rescale=rescale, subtract_max=subtract_max, mask_tail=mask_tail, use_table=use_table, block_max=block_max
        )
        walk = Walk(q, k_pool, v_pool, block_tables, seq, length, **mistakes)
        for head in range(num_heads):
            kv_head = head // group if head_map == "group" else head % num_kv_heads
            parts = []
            for split in range(num_splits):
                first, last = split * per_split, min((split + 1) * per_split, -(-length // block_size))
                parts.append(walk(head, kv_head, range(first, last)))
            out[seq, head] = _merge(parts, merge_rescaled, merge_shifted)
    return out.to(q.dtype)


class Walk:
    """One sequence's programs: a running softmax over some of its blocks, for one query head."""

    def __init__(self, q, k_pool, v_pool, tables, seq, length, **mistakes: bool):
        self.q, self.k_pool, self.v_pool, self.tables, self.seq, self.length = q, k_pool, v_pool, tables, seq, length
        self.rescale, self.subtract_max = mistakes["rescale"], mistakes["subtract_max"]
        self.mask_tail, self.use_table = mistakes["mask_tail"], mistakes["use_table"]
        self.block_max = mistakes["block_max"]

    def __call__(self, head: int, kv_head: int, blocks: range) -> tuple[float, float, torch.Tensor]:
        """(running max, running sum, weighted values) after ``blocks``, in float64."""
        block_size, head_dim = self.k_pool.shape[1], self.q.shape[2]
        query = self.q[self.seq, head].double()
        running_max, running_sum, acc = -math.inf, 0.0, torch.zeros(head_dim, dtype=torch.float64)
        for index in blocks:
            block = int(self.tables[self.seq, index]) if self.use_table else index
            keys, values = self.k_pool[block, :, kv_head].double(), self.v_pool[block, :, kv_head].double()
            scores = keys @ query / math.sqrt(head_dim)
            if self.mask_tail:
                visible = torch.arange(block_size) + index * block_size < self.length
                scores = scores.masked_fill(~visible, -math.inf)
            new_max = max(running_max, float(scores.max())) if self.subtract_max else 0.0
            new_max = float(scores.max()) if self.block_max else new_max
            factor = _exp32(running_max - new_max) if self.rescale and running_max > -math.inf else 1.0
            weights = torch.exp(scores - new_max).float().double()  # fp32's range: exp overflows as a kernel's would
            running_sum = running_sum * factor + float(weights.sum())
            acc = acc * factor + weights @ values
            running_max = new_max
        return running_max, running_sum, acc


def _exp32(x: float) -> float:
    """exp(x) as float32 computes it: inf past 88.7."""
    return float(torch.tensor(x, dtype=torch.float64).exp().float())


def _merge(parts: list[tuple[float, float, torch.Tensor]], rescaled: bool, shifted: bool) -> torch.Tensor:
    """Split-KV's merge: each part brought to the largest max (or, wrongly, added up as it is, or weighted
    by exp(max) with no max subtracted)."""
    top = max(part[0] for part in parts) if shifted else 0.0
    worth = [(_exp32(m - top) if rescaled else 1.0) if m > -math.inf else 0.0 for m, _, _ in parts]
    total = sum(w * s for w, (_, s, _) in zip(worth, parts))
    return sum(w * acc for w, (_, _, acc) in zip(worth, parts)) / total
