"""The paged decode kernel against the gather-then-SDPA path and SDPA on contiguous KV: time, bytes, share of peak.

One layer's decode step at batch 1, 8 and 64 and contexts of 512, 4k and 32k tokens, at SmolLM2-135M's
attention shapes and Llama-3.1-8B's, in bf16 on a GPU; then the default model's decode tokens/s in labkit's
engine with the kernel and with its own attention (gather, then SDPA), and whether their greedy tokens agree.

The method: separate K and V pools with each sequence's blocks scattered over them; every path timed by
CUDA events over many launches with the L2 cache flushed before each (``triton.testing.do_bench``, median);
split-KV with enough splits for two programs per multiprocessor of this card; the bytes each path reads
(:func:`labkit.kernels.bench_math.case_bytes`) over its time, as a share of the card's peak (its memory
clock x bus width x 2, from its own properties) and of a measured device-to-device copy, both printed.

    python scripts/kernel_bench.py [--out FILE.json]          # on a GPU
    python scripts/kernel_bench.py --quick [--out FILE.json]  # anywhere: tiny shapes, Triton's interpreter

``--quick`` checks that the three paths (and the engine with and without the kernel) agree at tiny shapes in
fp32; on a CPU every time it prints is the interpreter's and is labelled so. A case that fails (out of memory, a
kernel that does not compile) is recorded in its row and the rest still run; the exit status is 1 then.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

from labkit.kernels.bench_math import (
    case_bytes,
    copy_bandwidth,
    fraction_of_peak,
    over_peak_warning,
    peak_from_properties,
    splits_for_sms,
)
from labkit.kernels.paged_decode import decode_attention, paged_decode
from labkit.kernels.runtime import interpreted
from labkit.kernels.traffic import DecodeShape
from labkit.kv.paged_attention import paged_attention
from labkit.kv.paged_batch import PagedBatch, SequenceSlice

SHAPES = {"SmolLM2-135M": (9, 3, 64), "Llama-3.1-8B": (32, 8, 128)}  # query heads, KV heads, head_dim
BLOCK_SIZE = 16
CPU_LABEL = "CPU, interpreter: correctness only, not speed"
COPY_BYTES = 2**30  # a copy far bigger than any L2 cache


def timed(run, gpu: bool) -> tuple:
    """``run()``'s result and the seconds it takes: on a GPU the median by CUDA events over many launches, the L2
    cache flushed before each (``triton.testing.do_bench``); under the interpreter the run that gave the result,
    by the wall clock (a NumPy figure: not worth a second run)."""
    start = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - start
    if gpu:
        from triton.testing import do_bench

        seconds = do_bench(run, warmup=25, rep=100, return_mode="median") / 1e3
    return result, seconds


def card_bandwidth() -> dict:
    """This GPU as it reports itself (name, multiprocessors, L2, peak from its memory clock and bus width) and the
    bandwidth a device-to-device copy measures; ``peak`` is the properties' figure, else the copy's."""
    properties = torch.cuda.get_device_properties(0)
    source = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    copy = copy_bandwidth(COPY_BYTES, timed(lambda: target.copy_(source), gpu=True)[1])
    peak = peak_from_properties(properties)
    return {
        "name": properties.name,
        "multiprocessors": properties.multi_processor_count,
        "l2_bytes": getattr(properties, "L2_cache_size", None),
        "peak_from_properties": peak,
        "measured_copy": copy,
        "peak": peak or copy,
        "peak_source": "memory clock x bus width x 2" if peak else "measured copy (the properties give no clock)",
    }


def one_case(name: str, batch: int, context: int, device, dtype, card: dict | None) -> dict:
    """One layer's decode step at ``batch`` sequences of ``context`` tokens: the three paths' outputs compared,
    timed, and the bytes each reads; on a GPU the kernel's and SDPA's shares of the card's peak."""
    heads, kv_heads, head_dim = SHAPES[name]
    blocks = -(-context // BLOCK_SIZE)
    k_pool, v_pool = (
        torch.randn(batch * blocks, BLOCK_SIZE, kv_heads, head_dim, device=device, dtype=dtype) for _ in range(2)
    )
    order = torch.randperm(batch * blocks, device=device).to(torch.int32)  # blocks scattered over the pools
    tables = order.view(batch, blocks)
    lengths = torch.full((batch,), context, device=device, dtype=torch.int32)
    q = torch.randn(batch, heads, head_dim, device=device, dtype=dtype)
    # splits for this card's multiprocessors; two under the interpreter, so split-KV and its merge are checked
    splits = splits_for_sms(card["multiprocessors"], batch, kv_heads, blocks) if card else min(2, blocks)
    sequences = [SequenceSlice(i, 1, context, tables[i].tolist()) for i in range(batch)]
    paged = PagedBatch.build(sequences, BLOCK_SIZE, device, dtype)

    def contiguous(pool):
        return pool[order.long()].view(batch, blocks * BLOCK_SIZE, kv_heads, head_dim)[:, :context].transpose(1, 2)

    k_contiguous, v_contiguous = contiguous(k_pool), contiguous(v_pool)

    def sdpa():
        return F.scaled_dot_product_attention(q[:, :, None], k_contiguous, v_contiguous, enable_gqa=True)[:, :, 0]

    paths = {
        "kernel": lambda: paged_decode(q, k_pool, v_pool, tables, lengths, num_splits=splits),
        "gather": lambda: paged_attention(0, q, k_pool, v_pool, paged),
        "sdpa": sdpa,
    }
    results = {path: timed(run, gpu=card is not None) for path, run in paths.items()}
    outs = {path: out.float() for path, (out, _) in results.items()}
    worst = max((outs[path] - outs["sdpa"]).abs().max().item() for path in ("kernel", "gather"))
    seconds = {path: taken for path, (_, taken) in results.items()}
    counts = case_bytes(DecodeShape([context] * batch, BLOCK_SIZE, heads, kv_heads, head_dim, k_pool.element_size()))
    row = dict(model=name, batch=batch, context=context, splits=splits, max_difference=worst, seconds=seconds)
    row["bytes"] = counts
    row["kernel_bandwidth"] = counts["kernel"] / seconds["kernel"]
    if card:
        row["kernel_of_peak"] = fraction_of_peak(counts["kernel"], seconds["kernel"], card["peak"])
        row["sdpa_of_peak"] = fraction_of_peak(counts["sdpa"], seconds["sdpa"], card["peak"])
        row["kernel_of_copy"] = row["kernel_bandwidth"] / card["measured_copy"]
        if card["peak_from_properties"]:  # a read-only kernel may pass a measured copy, never the memory's peak
            worst_share = max(row["kernel_of_peak"], row["sdpa_of_peak"])
            row["warning"] = over_peak_warning(worst_share, counts["pools"], card["l2_bytes"])
    return row


def describe(row: dict, gpu: bool) -> str:
    """One line for a row: each path's time, the kernel's bytes and bandwidth, its share of the peak."""
    s = row["seconds"]
    line = (
        f"{row['model']:>13} batch {row['batch']:>2} context {row['context']:>6}: kernel ({row['splits']} splits) "
        f"{s['kernel'] * 1e6:9.1f} us, gather {s['gather'] * 1e6:9.1f} us, sdpa {s['sdpa'] * 1e6:9.1f} us; "
        f"kernel reads {row['bytes']['kernel'] / 2**20:8.2f} MiB at {row['kernel_bandwidth'] / 1e9:7.1f} GB/s"
    )
    if gpu:
        line += (
            f", {row['kernel_of_peak']:.0%} of peak ({row['kernel_of_copy']:.0%} of the copy; "
            f"sdpa {row['sdpa_of_peak']:.0%} of peak)"
        )
    line += f"; max difference {row['max_difference']:.1e}"
    return line if gpu else f"{line}  [{CPU_LABEL}]"


def engine_throughput(device, dtype, quick: bool) -> dict:
    """The default model's generated tokens/s in labkit's engine, with the kernel on every decode step and with
    its own attention (gather, then SDPA), on a GPU after a warm-up of each; and whether their greedy tokens agree."""
    from labkit.engine import LLM
    from labkit.models import load_model
    from labkit.sampling import SamplingParams

    model = load_model("default", device=device, dtype=dtype)
    prompts = ["What is the capital of France?", "Write a haiku about a busy GPU.", "What is 17 times 23?"]
    prompts = prompts[:1] if quick else prompts * 6
    params = SamplingParams(max_tokens=2 if quick else 64, ignore_eos=True)
    pool = dict(num_blocks=8 if quick else 1024)  # room for these prompts: the interpreter copies the whole pool
    engines = {"kernel": LLM(model, attention=decode_attention(), **pool), "sdpa": LLM(model, **pool)}
    result: dict = {"prompts": len(prompts), "max_tokens": params.max_tokens}
    tokens = {}
    for path, llm in engines.items():
        if not quick:
            llm.generate(prompts, params, use_tqdm=False)  # warm-up: compiles the kernels, fills the caches
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        tokens[path] = [output.token_ids for output in outputs]
        result[f"{path}_tokens_per_s"] = sum(len(ids) for ids in tokens[path]) / seconds
    result["tokens_agree"] = tokens["kernel"] == tokens["sdpa"]
    return result


def failed(what: str, error: Exception) -> dict:
    """A case that raised, recorded instead of ending the run (``error`` in the row, the exit status 1)."""
    print(f"{what}: FAILED: {type(error).__name__}: {error}", flush=True)
    return {"error": f"{type(error).__name__}: {error}"}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes in fp32, any machine: a correctness pass")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available() and not interpreted()
    if not gpu and not args.quick:
        parser.error(
            "no GPU here (or TRITON_INTERPRET=1): run with --quick for a correctness pass under the interpreter"
        )
    device = torch.device("cuda" if gpu else "cpu")
    dtype = torch.float32 if args.quick else torch.bfloat16  # fp32: a correctness pass compares to 1e-4
    grid = [(2, 40)] if args.quick else [(b, n) for b in (1, 8, 64) for n in (512, 4096, 32768)]
    card = card_bandwidth() if gpu else None
    if card:
        peak = card["peak_from_properties"]
        print(
            f"{card['name']}, {card['multiprocessors']} multiprocessors: peak "
            + (f"{peak / 1e12:.2f} TB/s (memory clock x bus width x 2)" if peak else "unknown (no memory clock)")
            + f"; a device-to-device copy measures {card['measured_copy'] / 1e12:.2f} TB/s",
            flush=True,
        )
        if args.quick:
            print("--quick: tiny shapes in fp32, a correctness pass (its times mean nothing about a card)", flush=True)
    else:
        print(f"{CPU_LABEL}: tiny shapes, fp32, Triton's interpreter", flush=True)
    result: dict = {"device": card["name"] if card else CPU_LABEL, "card": card, "rows": []}
    for name in SHAPES:
        for batch, context in grid:
            where = f"{name} batch {batch} context {context}"
            try:
                row = one_case(name, batch, context, device, dtype, card)
                print(describe(row, gpu), flush=True)
                if row.get("warning"):
                    print(f"  {row['warning']}", flush=True)
            except Exception as error:  # out of memory at 64 x 32k, a kernel that does not compile: say so, go on
                row = dict(model=name, batch=batch, context=context, **failed(where, error))
            result["rows"].append(row)
            if gpu:
                torch.cuda.empty_cache()
    try:
        result["engine"] = engine_throughput(device, dtype, args.quick)
        engine = result["engine"]
        print(
            f"engine, default model, {engine['prompts']} prompts x {engine['max_tokens']} tokens: "
            f"{engine['kernel_tokens_per_s']:.1f} tokens/s with the kernel, {engine['sdpa_tokens_per_s']:.1f} "
            f"with gather + SDPA; greedy tokens agree: {engine['tokens_agree']}" + ("" if gpu else f"  [{CPU_LABEL}]"),
            flush=True,
        )
    except Exception as error:
        result["engine"] = failed("engine", error)
    result["failures"] = sum("error" in row for row in result["rows"]) + ("error" in result["engine"])
    if args.out:
        with open(args.out, "w") as file:
            json.dump(result, file, indent=1)
    return result


if __name__ == "__main__":
    sys.exit(1 if main()["failures"] else 0)
