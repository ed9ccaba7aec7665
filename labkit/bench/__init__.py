"""Benchmark labkit's engine against Hugging Face generate on real ShareGPT prompts.

Five ways to serve the same seeded workload, in one process: (a) HF ``generate`` one
request at a time, (b) HF ``generate`` in static batches of 8, (c) labkit static
batching, (d) labkit continuous batching, (e) labkit continuous batching with chunked
prefill. One table compares them, each relative to (a). ``--sweep`` adds the decode-step
time against batch size, beside the roofline bound of this machine; ``--busy N`` runs it all
while N other cores spin, as on a machine that is not idle.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from labkit.bench.busy import busy_cores
from labkit.metrics import Summary, summarize
from labkit.trace import Trace


@dataclass
class BenchRow:
    name: str
    summary: Summary


def run_bench(model, num_prompts: int = 64, seed: int = 0, max_prompt_tokens: int = 512,
              max_output_tokens: int = 128, max_num_seqs: int = 64, hf_batch_size: int = 8) -> list[BenchRow]:
    """Serve one workload five ways and summarise each run (see the module docstring)."""
    from labkit.bench.hf_baselines import hf_static_batches
    from labkit.workloads import sharegpt_prompts

    workload = sharegpt_prompts(num_prompts, seed=seed, tokenizer=model.tokenizer,
                                max_prompt_tokens=max_prompt_tokens, max_output_tokens=max_output_tokens)
    prompts = [_token_ids(model, spec.prompt) for spec in workload]
    lengths = [spec.output_len for spec in workload]
    runs = [("(a) HF generate, one at a time", lambda: hf_static_batches(model, prompts, lengths, 1, "hf-1")),
            (f"(b) HF generate, static batches of {hf_batch_size}",
             lambda: hf_static_batches(model, prompts, lengths, hf_batch_size, f"hf-{hf_batch_size}"))]
    for label, policy in [("(c) labkit static batching", "static"), ("(d) labkit continuous batching", "continuous"),
                          ("(e) labkit chunked prefill", "chunked")]:
        runs.append((label, lambda policy=policy: _labkit_run(model, policy, prompts, lengths, max_num_seqs,
                                                              max_prompt_tokens + max_output_tokens)))
    rows = []
    for label, run in runs:
        print(f"running {label} ...", flush=True)
        rows.append(BenchRow(label, summarize(run())))
    return rows


def _token_ids(model, prompt) -> list[int]:
    from labkit.models.tokens import encode_prompt

    return encode_prompt(model.tokenizer, prompt)


def _labkit_run(model, policy: str, prompts, lengths, max_num_seqs: int, max_model_len: int) -> Trace:
    from labkit.engine.llm import LLM
    from labkit.sampling import SamplingParams

    llm = LLM(model, policy=policy, max_num_seqs=max_num_seqs, max_model_len=max_model_len)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    llm.generate(prompts, params, use_tqdm=False)
    return llm.trace


def format_table(rows: list[BenchRow]) -> str:
    """One line per engine: throughput, latency percentiles, batching waste, ratios to row (a)."""
    base = rows[0].summary.output_throughput
    header = (f"{'engine':<40} {'out tok/s':>9} {'x (a)':>6} {'TTFT p50':>9} {'TTFT p99':>9} "
              f"{'TPOT p50':>9} {'TPOT p99':>9} {'slot util':>9} {'padded':>7}")
    lines = [header, "-" * len(header)]
    for row in rows:
        s = row.summary
        lines.append(f"{row.name:<40} {s.output_throughput:>9.1f} {s.output_throughput / base:>6.2f} "
                     f"{s.ttft_ms.median:>9.0f} {s.ttft_ms.p99:>9.0f} {s.tpot_ms.median:>9.1f} "
                     f"{s.tpot_ms.p99:>9.1f} {s.slot_utilization:>9.2f} {s.padded_slot_steps:>7}")
    lines.append("(times in ms; padded = slot-steps held by sequences that had already finished)")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16")
    parser.add_argument("--num-prompts", type=int, default=64, help="fewer for a quick run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--max-output-tokens", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--sweep", action="store_true", help="also time decode steps at batch 1..64")
    parser.add_argument("--skip-serving", action="store_true", help="only the decode sweep")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="keep N cores busy with spin loops during the run (a machine that is not idle)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")


def run(args: argparse.Namespace) -> int:
    import torch

    from labkit.models import load_model

    model = load_model(args.model, device=args.device, dtype=args.dtype)
    print(f"model {model.config.name} on {model.device}, {model.dtype}")
    results: dict = {"model": model.config.name, "device": str(model.device), "dtype": str(model.dtype),
                     "torch threads": torch.get_num_threads(), "matmuls": model.matmul.describe(),
                     "busy cores": args.busy}
    print(f"torch threads {torch.get_num_threads()}, matmuls {model.matmul.describe()}, "
          f"{args.busy} other core(s) kept busy")
    with busy_cores(args.busy):
        _serve_and_sweep(model, args, results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=float))
    return 0


def _serve_and_sweep(model, args: argparse.Namespace, results: dict) -> None:
    if not args.skip_serving:
        rows = run_bench(model, args.num_prompts, args.seed, args.max_prompt_tokens, args.max_output_tokens,
                         args.max_num_seqs)
        print(format_table(rows))
        results["serving"] = {row.name: row.summary.to_dict() for row in rows}
    if args.sweep or args.skip_serving:
        from labkit.bench.decode_sweep import decode_sweep, format_sweep
        from labkit.sim.hardware import probe_this_machine

        hardware = probe_this_machine(model.device)
        print(f"\ndecode step sweep, context 128 tokens; bound from {hardware}")
        points = decode_sweep(model, hardware)
        print(format_sweep(points))
        results["sweep"] = [vars(p) for p in points]
