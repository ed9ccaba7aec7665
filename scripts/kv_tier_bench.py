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
import statistics

import torch

from labkit.bench.kv_tier import BLOCK_SIZE, crossover, reload_against_recompute, returning_ttft
from labkit.models import load_model, tiny_model


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
