"""The paged decode kernel against the gather-then-SDPA path and SDPA on contiguous KV: time, bytes, bandwidth.

One layer's decode step at batch 1, 8 and 64 and contexts of 512, 4k and 32k tokens, at SmolLM2-135M's
attention shapes and Llama-3.1-8B's, in bf16 on a GPU. For each: the kernel's time (labkit's, with as many
splits as it takes to give the GPU's multiprocessors two programs each), the gather path's (labkit's
``paged_attention``) and SDPA's on a contiguous cache, the bytes the kernel reads and the bandwidth it reaches,
as a fraction of the card's (from labkit's hardware presets, when the card is one of them). Medians of
several timed runs after a warm-up. Then the engine's greedy tokens on the default model with the kernel
and without.

    python scripts/kernel_bench.py [--out FILE.json]          # on a GPU
    python scripts/kernel_bench.py --quick                    # anywhere: tiny shapes, Triton's interpreter

``--quick`` checks that the three paths agree at small shapes; its times are the interpreter's and mean
nothing about a GPU (it says so in every row).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F

from labkit.kernels.paged_decode import decode_attention, paged_decode
from labkit.kernels.runtime import interpreted
from labkit.kernels.traffic import DecodeShape, decode_bytes
from labkit.kv.paged_attention import paged_attention
from labkit.kv.paged_batch import PagedBatch, SequenceSlice

SHAPES = {"SmolLM2-135M": (9, 3, 64), "Llama-3.1-8B": (32, 8, 128)}  # query heads, KV heads, head_dim
BLOCK_SIZE = 16


def timed(run, repeats: int) -> float:
    """Median seconds of ``run()`` over ``repeats`` runs, after one warm-up (synchronized on a GPU)."""
    run()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def splits_for(batch: int, kv_heads: int, blocks: int) -> int:
    """Enough splits for two programs per multiprocessor (one on the interpreter), never more than the blocks."""
    if not torch.cuda.is_available():
        return 1
    programs = 2 * torch.cuda.get_device_properties(0).multi_processor_count
    return max(1, min(blocks, math.ceil(programs / (batch * kv_heads))))


def one_case(name: str, batch: int, context: int, device, dtype, repeats: int) -> dict:
    heads, kv_heads, head_dim = SHAPES[name]
    blocks = -(-context // BLOCK_SIZE)
    pool = torch.randn(batch * blocks, BLOCK_SIZE, kv_heads, head_dim, device=device, dtype=dtype)
    order = torch.randperm(batch * blocks, device=device).to(torch.int32)  # blocks scattered over the pool
    tables = order.view(batch, blocks)
    lengths = torch.full((batch,), context, device=device, dtype=torch.int32)
    q = torch.randn(batch, heads, head_dim, device=device, dtype=dtype)
    splits = splits_for(batch, kv_heads, blocks)
    sequences = [SequenceSlice(i, 1, context, tables[i].tolist()) for i in range(batch)]
    paged = PagedBatch.build(sequences, BLOCK_SIZE, device, dtype)
    contiguous = pool[order.long()].view(batch, blocks * BLOCK_SIZE, kv_heads, head_dim)[:, :context].transpose(1, 2)

    def kernel():
        return paged_decode(q, pool, pool, tables, lengths, num_splits=splits)

    def gather():
        return paged_attention(0, q, pool, pool, paged)

    def sdpa():
        return F.scaled_dot_product_attention(q[:, :, None], contiguous, contiguous, enable_gqa=True)[:, :, 0]

    outs = {path: run().float() for path, run in (("kernel", kernel), ("gather", gather), ("sdpa", sdpa))}
    worst = max((outs[path] - outs["sdpa"]).abs().max().item() for path in ("kernel", "gather"))
    times = {path: timed(run, repeats) for path, run in (("kernel", kernel), ("gather", gather), ("sdpa", sdpa))}
    counts = decode_bytes(DecodeShape([context] * batch, BLOCK_SIZE, heads, kv_heads, head_dim, pool.element_size()))
    return dict(
        model=name,
        batch=batch,
        context=context,
        splits=splits,
        max_difference=worst,
        seconds=times,
        bytes=counts,
        kernel_bandwidth=counts["kernel"] / times["kernel"],
    )


def peak_bandwidth() -> float | None:
    """The card's memory bandwidth from labkit's presets, when this GPU is one of them."""
    from labkit.sim.hardware import PRESETS

    name = torch.cuda.get_device_name().lower()
    found = [hw for key, hw in PRESETS.items() if key.split("-")[0] in name]
    return found[0].bandwidth if found else None


def engine_tokens_agree(device, dtype) -> bool:
    """The default model's greedy tokens with labkit's kernel on every decode step equal its own attention's."""
    from labkit.engine import LLM
    from labkit.models import load_model
    from labkit.sampling import SamplingParams

    model = load_model("default", device=device, dtype=dtype)
    prompts = ["What is the capital of France?", "Write a haiku about a busy GPU.", "What is 17 times 23?"]
    params = SamplingParams(max_tokens=24)
    own = LLM(model).generate(prompts, params, use_tqdm=False)
    kernel = LLM(model, attention=decode_attention()).generate(prompts, params, use_tqdm=False)
    return [o.token_ids for o in own] == [o.token_ids for o in kernel]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, any machine (the interpreter's times)")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available() and not interpreted()
    if not gpu and not args.quick:
        parser.error(
            "no GPU here (or TRITON_INTERPRET=1): run with --quick for a correctness pass under the interpreter"
        )
    device = torch.device("cuda" if gpu else "cpu")
    dtype = torch.bfloat16 if gpu else torch.float32
    grid = [(1, 40), (2, 100)] if args.quick else [(b, n) for b in (1, 8, 64) for n in (512, 4096, 32768)]
    peak = peak_bandwidth() if gpu else None
    rows = []
    for name in SHAPES:
        for batch, context in grid:
            row = one_case(name, batch, context, device, dtype, repeats=2 if args.quick else 20)
            rows.append(row)
            s = row["seconds"]
            fraction = f", {row['kernel_bandwidth'] / peak:.0%} of the card's" if peak else ""
            where = "" if gpu else "  [interpreter: correctness only]"
            print(
                f"{name:>13} batch {batch:>2} context {context:>6}: kernel ({row['splits']} splits) "
                f"{s['kernel'] * 1e6:9.1f} us, gather {s['gather'] * 1e6:9.1f} us, sdpa {s['sdpa'] * 1e6:9.1f} us; "
                f"{row['bytes']['kernel'] / 2**20:8.1f} MiB at {row['kernel_bandwidth'] / 1e9:7.1f} GB/s{fraction}; "
                f"max difference {row['max_difference']:.1e}{where}"
            )
    result = {"device": torch.cuda.get_device_name() if gpu else "cpu (Triton's interpreter)", "rows": rows}
    if gpu:
        result["engine_tokens_agree"] = engine_tokens_agree(device, dtype)
        print("engine's tokens with the kernel equal its own:", result["engine_tokens_agree"])
    if args.out:
        with open(args.out, "w") as file:
            json.dump(result, file, indent=1)
    return result


if __name__ == "__main__":
    main()
