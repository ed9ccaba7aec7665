"""Benchmark labkit's engine against Hugging Face generate on real ShareGPT prompts.

Five ways to serve the same seeded workload, in one process: (a) HF ``generate`` one
request at a time, (b) HF ``generate`` in static batches of 8, (c) labkit static
batching, (d) labkit continuous batching, (e) labkit continuous batching with chunked
prefill. One table compares them, each relative to (a). ``--sweep`` adds the decode-step
time against batch size, beside the roofline bound of this machine; ``--profile`` takes a decode
step apart (linear layers, attention, norms, sampling and the scheduler) at batch 1 to 64, with each
``--attention`` (gather, blockwise) and ``--kv-cache-dtype`` given, in turns; ``--busy N`` runs it all
while N other cores spin, as on a machine that is not idle. ``--json`` prints the results
as JSON (progress and tables go to stderr); ``--out`` writes the same JSON to a file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from labkit.cli import print_json, say_for
from labkit.serve.serve_cli import quantization_flag


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16")
    parser.add_argument(
        "--quantization",
        type=quantization_flag,
        help="int8: time the model as `labkit serve --quantization int8` runs it (default: unquantized)",
    )
    parser.add_argument("--num-prompts", type=int, default=64, help="fewer for a quick run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--max-output-tokens", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--sweep", action="store_true", help="also time decode steps at batch 1..64")
    parser.add_argument("--skip-serving", action="store_true", help="only the decode sweep (or only the profile)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="where a decode step's time goes at batch 1, 8, 32 and 64, beside its memory floor",
    )
    parser.add_argument(
        "--attention",
        type=_names,
        default=["gather"],
        help="with --profile: the decode attentions to profile in turns, comma-separated: gather (copy the blocks "
        "into a padded buffer, then SDPA; labkit's default over an fp32 cache) and blockwise (walk the block tables "
        "part by part, no padded copy; CPU only), e.g. gather,blockwise (default: gather)",
    )
    parser.add_argument(
        "--profile-batches",
        type=lambda text: [int(size) for size in _names(text)],
        default=None,
        metavar="SIZES",
        help="with --profile: the batch sizes, comma-separated (default: 1,8,32,64)",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        type=_names,
        default=["auto"],
        help="with --profile: the KV cache storages to profile in turns, comma-separated: auto, bfloat16, fp8 "
        "(default: auto)",
    )
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="keep N cores busy with spin loops during the run (a machine that is not idle)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--json", action="store_true", help="print the results as JSON; tables go to stderr")


def _names(text: str) -> list[str]:
    """A comma-separated list of names, e.g. "gather,blockwise"."""
    return [name.strip() for name in text.split(",") if name.strip()]


def run(args: argparse.Namespace) -> int:
    import torch

    from labkit.bench.busy import busy_cores
    from labkit.models import load_model

    say = say_for(args)
    from labkit.engine.quantization import quantize_for_serving

    model, quantization = quantize_for_serving(
        load_model(args.model, device=args.device, dtype=args.dtype), args.quantization
    )
    say(f"model {model.config.name} on {model.device}, {model.dtype}, linears {quantization.describe()}")
    results: dict = {
        "model": model.config.name,
        "device": str(model.device),
        "dtype": str(model.dtype),
        "torch threads": torch.get_num_threads(),
        "matmuls": model.matmul.describe(),
        "quantization": quantization.quantization,
        "busy cores": args.busy,
    }
    say(
        f"torch threads {torch.get_num_threads()}, matmuls {model.matmul.describe()}, "
        f"{args.busy} other core(s) kept busy"
    )
    with busy_cores(args.busy):
        _serve_and_sweep(model, args, results, say)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=float))
    if args.json:
        print_json(results)
    return 0


def _serve_and_sweep(model, args: argparse.Namespace, results: dict, say) -> None:
    from labkit.bench import format_table, run_bench

    if not args.skip_serving:
        rows = run_bench(
            model,
            args.num_prompts,
            args.seed,
            args.max_prompt_tokens,
            args.max_output_tokens,
            args.max_num_seqs,
            progress=say,
        )
        say(format_table(rows))
        results["serving"] = {row.name: row.summary.to_dict() for row in rows}
    if args.profile:
        from labkit.bench.step_profile import BATCHES, profile_note, step_profile
        from labkit.sim.hardware import measure_bandwidth

        bandwidth = measure_bandwidth(device=model.device)
        say(f"\ndecode step profile; memory floor at the measured {bandwidth / 1e9:.1f} GB/s")
        profiles = step_profile(
            model,
            bandwidth,
            args.profile_batches or BATCHES,
            attentions=args.attention,
            kv_cache_dtypes=args.kv_cache_dtype,
            progress=say,  # the table, each row as soon as it is measured
        )
        say(profile_note(profiles[0].context))
        results["step profile"] = [{**vars(p), "floor_fraction": p.floor_fraction} for p in profiles]
    if args.sweep or (args.skip_serving and not args.profile):
        from labkit.bench.decode_sweep import decode_sweep, format_sweep
        from labkit.sim.hardware import probe_this_machine

        hardware = probe_this_machine(model.device)
        say(f"\ndecode step sweep, context 128 tokens; bound from {hardware}")
        points = decode_sweep(model, hardware)
        say(format_sweep(points))
        results["sweep"] = [vars(p) for p in points]
