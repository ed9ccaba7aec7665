"""The slower KV tier on this machine: reloading a prefix's blocks against computing its tokens again, by prefix
length (and where one overtakes the other), then the time to first token of returning conversations, tier on
and off, in one run.

Part 1: for each prefix length, the seconds to copy its blocks from the tier into the pool (host memory and
disk; each block is read from the tier and written into every layer's K/V pool, as the engine's runner
does) against the seconds to prefill those tokens (a prompt one token longer, prefix caching off, time to
its first token). The costs lab 12's ``reload_or_recompute`` weighs are fitted from them: a fixed cost per
reload and one per block (a line through the shortest and longest prefix), and one per token.

Part 2: ``--conversations`` chats, each a prefix of ``--prefix-tokens`` tokens, served one after another on a
pool that holds only about one of them, so each evicts the one before; then every chat returns with one more
question. Their time to first token with the tier on (host memory, large enough for all) and off; the ratio.

Usage: .venv/bin/python scripts/kv_tier_bench.py [--model default] [--lengths 16 64 256 1024] [--repeats 3]
       [--conversations 4] [--prefix-tokens 512] [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from labkit.engine import LLM
from labkit.kv.tier import DiskTier, HostTier, block_bytes, read_block, write_block
from labkit.kv.tier_policy import GIB, TierCosts
from labkit.models import load_model, tiny_model
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
        rows.append(
            dict(
                tokens=length,
                blocks=blocks,
                host_s=host,
                disk_s=disk,
                recompute_s=prefill_seconds(llm, length, repeats),
            )
        )
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


def returning_ttft(model, conversations: int, prefix_tokens: int, tier_on: bool) -> tuple[list[float], int]:
    """Time to first token of each returning conversation, and the prompt tokens their turn computed."""
    blocks = prefix_tokens // BLOCK_SIZE + 2  # one returning conversation: each evicts the one before
    size = None
    if tier_on:
        llm_bytes = (conversations + 1) * blocks * BLOCK_SIZE * model.config.kv_bytes_per_token(model.dtype)
        size = llm_bytes / GIB
    llm = LLM(model, num_blocks=blocks, block_size=BLOCK_SIZE, max_num_seqs=1, max_model_len=blocks * BLOCK_SIZE,
              kv_offloading_size=size)  # fmt: skip
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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="'default', a checkpoint, or 'tiny' (random weights)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256, 1024], help="prefix lengths (tokens)")
    parser.add_argument("--repeats", type=int, default=3, help="timings per point; the table shows medians")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--prefix-tokens", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="the tiny model at tiny sizes (a test runs this)")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.lengths, args.repeats, args.conversations, args.prefix_tokens = "tiny", [16, 64], 1, 2, 64
    if any(length < BLOCK_SIZE or length % BLOCK_SIZE for length in args.lengths):
        parser.error(f"--lengths must be whole blocks of {BLOCK_SIZE} tokens, got {args.lengths}")
    model = tiny_model(vocab_size=5008) if args.model == "tiny" else load_model(args.model)
    torch.set_grad_enabled(False)
    print(f"model {model.config.name}, {model.dtype}, {torch.get_num_threads()} torch threads, block of {BLOCK_SIZE}")
    rows, costs, bytes_per_block = reload_against_recompute(model, sorted(args.lengths), args.repeats)
    print(f"one block: {bytes_per_block:,} bytes (K and V, every layer)")
    print(
        f"{'tokens':>7} {'blocks':>6} {'host ms':>9} {'disk ms':>9} {'prefill ms':>11} {'prefill/host':>13} {'prefill/disk':>13}"
    )
    for row in rows:
        print(
            f"{row['tokens']:>7} {row['blocks']:>6} {row['host_s'] * 1e3:>9.3f} {row['disk_s'] * 1e3:>9.3f} "
            f"{row['recompute_s'] * 1e3:>11.2f} {row['recompute_s'] / row['host_s']:>13.1f} "
            f"{row['recompute_s'] / row['disk_s']:>13.1f}"
        )
    print(f"crossover, host memory: {crossover(rows, 'host_s')}; disk: {crossover(rows, 'disk_s')}")
    print(
        f"fitted costs: TierCosts(reload_fixed_seconds={costs.reload_fixed_seconds:.2e}, "
        f"reload_seconds_per_block={costs.reload_seconds_per_block:.2e}, "
        f"recompute_seconds_per_token={costs.recompute_seconds_per_token:.2e})"
    )
    runs = {on: returning_ttft(model, args.conversations, args.prefix_tokens, on) for on in (False, True)}
    (off_ttft, off_computed), (on_ttft, on_computed) = runs[False], runs[True]
    ratio = statistics.median(off_ttft) / statistics.median(on_ttft)
    print(
        f"returning conversations ({args.conversations} x {args.prefix_tokens} tokens): TTFT p50 tier off "
        f"{statistics.median(off_ttft) * 1e3:.1f} ms, on {statistics.median(on_ttft) * 1e3:.1f} ms "
        f"(off/on {ratio:.2f}x); prompt tokens computed {off_computed} off, {on_computed} on"
    )
    return dict(
        rows=rows, costs=costs, ttft=dict(off=off_ttft, on=on_ttft), computed=dict(off=off_computed, on=on_computed)
    )


if __name__ == "__main__":
    main()
