"""Reload an evicted prefix from a slower tier, or compute it again: the time to first token of each, on a GPU.

Why: when a conversation comes back after its prefix blocks left GPU memory, the engine can copy their KV back from
host memory or a local SSD, or prefill the prefix again. Which is faster depends on the GPU, the model and the link,
not on a rule of thumb: the copy costs a fixed latency plus the prefix's KV bytes over the link; the recomputation
costs its arithmetic, but only once the pass is compute-bound, since the next turn's pass reads every weight anyway
(:mod:`labkit.sim.cost_model`). So short prefixes are free to compute again and long ones are cheaper to reload.

Both sides are the cost model's, with no overlap: engines that load layer by layer while computing (LMCache) hide
part of the copy, and the cost model leaves attention's arithmetic out, which grows with the square of the prefix;
both favour reloading more than these figures do. ``scripts/kv_tier_bench.py`` measures the same race on this CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.sim.cost_model import CostModel
from labkit.sim.disagg import Link
from labkit.sim.hardware import GB

# Round figures for the tiers a GPU server has: pinned host memory over the GPU's PCIe x16 link (one direction;
# the datasheets quote both together: A100 PCIe 4.0, 64 GB/s; H100 PCIe 5.0, 128 GB/s), and one PCIe 4.0 NVMe
# drive (about 7 GB/s of sequential reads, a tenth of a millisecond to start one).
HOST_PCIE4 = Link(32 * GB, 10e-6, name="host memory, PCIe 4.0 x16")
HOST_PCIE5 = Link(64 * GB, 10e-6, name="host memory, PCIe 5.0 x16")
NVME_SSD = Link(7 * GB, 100e-6, name="local NVMe SSD")


def reload_seconds(tier: Link, kv_bytes_per_token: float, prefix_tokens: int) -> float:
    """Seconds to copy ``prefix_tokens`` tokens of KV from ``tier`` into GPU memory: its latency, then the bytes."""
    if prefix_tokens < 0:
        raise ValueError(f"prefix_tokens must be 0 or more, got {prefix_tokens!r}")
    if prefix_tokens == 0:
        return 0.0
    return tier.latency_s + tier.busy_s(kv_bytes_per_token * prefix_tokens)


def returning_turn_seconds(cost: CostModel, prefix_tokens: int, new_tokens: int, tier: Link | None = None) -> float:
    """Time to first token of a conversation's next turn whose ``prefix_tokens`` left GPU memory.

    Without a ``tier`` the pass computes the prefix again with the turn's ``new_tokens``; with one, the prefix's
    KV is copied back first and the pass computes only the new tokens while reading it.
    """
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be 1 or more (the turn's own tokens), got {new_tokens!r}")
    if tier is None:
        return cost.prefill_time(prefix_tokens + new_tokens)
    reload = reload_seconds(tier, cost.kv_bytes_per_token, prefix_tokens)
    return reload + cost.prefill_time(prefix_tokens + new_tokens, cached_len=prefix_tokens)


@dataclass(frozen=True)
class TierRace:
    """Recompute against reload from each tier, by prefix length: seconds to the returning turn's first token."""

    prefix_tokens: tuple[int, ...]
    recompute_s: tuple[float, ...]
    reload_s: dict[str, tuple[float, ...]]  # tier name -> seconds at each prefix length

    def crossover(self, tier_name: str) -> int | None:
        """The shortest prefix length from which reloading from ``tier_name`` is faster at every longer length
        measured; None if it is not faster at the longest."""
        reload = self.reload_s[tier_name]
        first = None
        for tokens, recompute, copy in zip(self.prefix_tokens, self.recompute_s, reload):
            if copy < recompute:
                first = tokens if first is None else first
            else:
                first = None
        return first


def reload_or_recompute_race(
    cost: CostModel, tiers: tuple[Link, ...], prefix_lengths: list[int] | tuple[int, ...], new_tokens: int = 100
) -> TierRace:
    """The returning turn's time to first token at each prefix length: computed again, or reloaded from each tier."""
    lengths = tuple(sorted(prefix_lengths))
    if not lengths or lengths[0] < 1:
        raise ValueError(f"give prefix lengths of 1 token or more, got {list(prefix_lengths)!r}")
    names = [tier.describe() for tier in tiers]
    if len(set(names)) != len(names):
        raise ValueError(f"each tier needs its own name to be told apart, got {names}")
    return TierRace(
        lengths,
        tuple(returning_turn_seconds(cost, n, new_tokens) for n in lengths),
        {
            name: tuple(returning_turn_seconds(cost, n, new_tokens, tier) for n in lengths)
            for name, tier in zip(names, tiers)
        },
    )
