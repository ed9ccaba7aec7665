"""The slower KV tier measured on this machine: reloading a prefix's blocks against computing its tokens again,
and the time to first token of conversations that return after their prefix left the pool.

Why: whether a reload beats a recompute depends on this machine's copy and prefill speeds, so lab 12's
``reload_or_recompute`` weighs costs measured here (:func:`reload_against_recompute` fits them), and
:func:`returning_ttft` shows what the tier (and a reload policy) does to returning conversations.
``scripts/kv_tier_bench.py`` prints both as tables.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence

from labkit.engine import LLM
from labkit.kv.tier import DiskTier, HostTier, block_bytes, read_block, write_block
from labkit.kv.tier_policy import GIB, TierCosts
from labkit.sampling import SamplingParams

BLOCK_SIZE = 16
FIRST_TOKEN = SamplingParams(max_tokens=1, ignore_eos=True)


def tokens(seed: int, count: int) -> list[int]:
    r = random.Random(seed)
    return [r.randint(10, 5000) for _ in range(count)]


def reload_seconds(llm: LLM, tier, num_blocks: int, repeats: int) -> float:
    """Median seconds to copy ``num_blocks`` blocks from ``tier`` into the pool (filled from the pool first)."""
    cache = llm.runner.cache
    for block in range(num_blocks):
        tier.put(block, read_block(cache, block))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for block in range(num_blocks):
            write_block(cache, block, tier.get(block))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def prefill_seconds(llm: LLM, num_tokens: int, repeats: int) -> float:
    """Median time to first token of a prompt of ``num_tokens`` + 1 tokens, nothing cached (after one untimed run:
    the first pass at a new length pays for setting up its shapes)."""
    times = []
    llm.generate([tokens(-1, num_tokens + 1)], FIRST_TOKEN, use_tqdm=False)
    for seed in range(repeats):
        llm.generate([tokens(seed, num_tokens + 1)], FIRST_TOKEN, use_tqdm=False)
        record = llm.trace.requests[0]
        times.append(record.first_token_time - record.arrival_time)
    return statistics.median(times)


def reload_against_recompute(model, lengths: list[int], repeats: int) -> tuple[list[dict], TierCosts, int]:
    """A row per prefix length (seconds to reload its blocks from each tier, and to prefill it), the costs fitted
    from them, and the bytes of one block."""
    longest = max(lengths)
    llm = LLM(model, num_blocks=longest // BLOCK_SIZE + 2, block_size=BLOCK_SIZE, max_num_seqs=1,
              max_model_len=longest + 8, enable_prefix_caching=False)  # fmt: skip
    rows = []
    for length in lengths:
        blocks = length // BLOCK_SIZE
        host = reload_seconds(llm, HostTier(blocks), blocks, repeats)
        disk = reload_seconds(llm, DiskTier(blocks), blocks, repeats)
        recompute = prefill_seconds(llm, length, repeats)
        rows.append(dict(tokens=length, blocks=blocks, host_s=host, disk_s=disk, recompute_s=recompute))
    first, last = rows[0], rows[-1]
    per_block = max((last["host_s"] - first["host_s"]) / max(last["blocks"] - first["blocks"], 1), 0.0)
    costs = TierCosts(
        max(first["host_s"] - per_block * first["blocks"], 0.0), per_block, last["recompute_s"] / last["tokens"]
    )
    return rows, costs, block_bytes(llm.runner.cache)


def crossover(rows: list[dict], key: str) -> str:
    """Where reloading from ``key``'s tier starts to beat computing the tokens again, in words."""
    wins = [row["recompute_s"] > row[key] for row in rows]
    if all(wins):
        return f"reload is faster at every length measured (from {rows[0]['tokens']} tokens)"
    if not any(wins):
        return f"recompute is faster at every length measured (up to {rows[-1]['tokens']} tokens)"
    first_win = next(row["tokens"] for row, win in zip(rows, wins) if win)
    return f"reload is faster from {first_win} tokens"


def returning_ttft(
    model,
    conversations: int,
    prefix_tokens: int,
    tier_on: bool,
    reload_policy: Callable[[int, int, int, int], Sequence[int]] | None = None,
) -> tuple[list[float], int]:
    """Time to first token of each returning conversation, and the prompt tokens their turn computed (with the
    tier on, ``reload_policy`` picks the blocks to reload; None reloads every one found)."""
    blocks = prefix_tokens // BLOCK_SIZE + 2  # one returning conversation: each evicts the one before
    size = None
    if tier_on:
        llm_bytes = (conversations + 1) * blocks * BLOCK_SIZE * model.config.kv_bytes_per_token(model.dtype)
        size = llm_bytes / GIB
    llm = LLM(model, num_blocks=blocks, block_size=BLOCK_SIZE, max_num_seqs=1, max_model_len=blocks * BLOCK_SIZE,
              kv_offloading_size=size, reload_policy=reload_policy if tier_on else None)  # fmt: skip
    chats = [tokens(100 + index, prefix_tokens) for index in range(conversations)]
    for chat in chats:
        llm.generate([chat], FIRST_TOKEN, use_tqdm=False)
    ttfts, computed = [], 0
    for index, chat in enumerate(chats):  # all return, the first (long evicted) first
        llm.generate([chat + tokens(200 + index, 8)], FIRST_TOKEN, use_tqdm=False)
        record = llm.trace.requests[0]
        ttfts.append(record.first_token_time - record.arrival_time)
        computed += sum(step.num_prefill_tokens for step in llm.trace.steps)
    return ttfts, computed
