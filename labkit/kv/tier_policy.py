"""The tier's plain-Python side (the engine's config and the allocator, shared with the simulator, use it): its
size in blocks, and :func:`reload_or_recompute`, lab 12's decision whether a run found there is worth reloading.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
BACKENDS = ("native", "disk")  # vLLM's name for its own CPU offloading, and labkit's files on disk


def capacity_in_blocks(size_gib: float, bytes_per_block: int) -> int:
    """Whole blocks that ``size_gib`` GiB (a number EngineConfig checked) hold; refused below one block."""
    blocks = int(size_gib * GIB / bytes_per_block + 1e-6)  # the epsilon: a size given as n blocks' bytes is n
    if blocks < 1:
        raise ValueError(
            f"kv_offloading_size={size_gib} GiB holds no block: one block takes {bytes_per_block:,} bytes "
            f"({bytes_per_block / GIB:.2e} GiB); give at least that"
        )
    return blocks


@dataclass(frozen=True)
class TierCosts:
    """Measured costs (``scripts/kv_tier_bench.py`` measures them on this machine): a reload costs
    ``reload_fixed_seconds`` once plus ``reload_seconds_per_block`` per block; computing the tokens again
    costs ``recompute_seconds_per_token`` per token (prefill, at that prefix length)."""

    reload_fixed_seconds: float
    reload_seconds_per_block: float
    recompute_seconds_per_token: float


def reload_or_recompute(
    prompt_tokens: int, cached_tokens: int, tier_blocks: int, block_size: int, costs: TierCosts | None = None
) -> list[int]:
    """The positions (block indices in the prompt) of the blocks to reload from the tier, or [] to compute them.

    The pool's run ends at ``cached_tokens``; the tier holds ``tier_blocks`` blocks in a row from there. Only
    whole blocks before the prompt's last token may be reloaded (its logits give the first output token).
    Reload them all when that costs less than computing their tokens; without measured ``costs``, reload
    every one (as vLLM's offloading connector loads every hit).
    """
    first = cached_tokens // block_size
    count = max(0, min(tier_blocks, (prompt_tokens - 1) // block_size - first))
    if count and costs is not None:
        reload = costs.reload_fixed_seconds + count * costs.reload_seconds_per_block
        recompute = count * block_size * costs.recompute_seconds_per_token
        if reload >= recompute:
            return []
    return list(range(first, first + count))
