"""Show this machine, the model, its size, KV bytes per token and the single-stream decode bound.

The CPU and the kernel path its matrix multiplies take come first, with what `labkit serve` computes
in and why (from timings kept for this machine; ``--remeasure`` takes them again), then the model's facts;
``--json`` prints them all as one JSON object.
"""

from __future__ import annotations

import argparse

from labkit.cli import print_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default", help="'default', a checkpoint folder or a cached hub id")
    parser.add_argument("--device", default=None, help="cpu, cuda, mps (default: labkit's choice)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16, float16")
    parser.add_argument(
        "--bandwidth",
        type=float,
        default=None,
        help="memory bandwidth in GB/s for the decode bound (default: measure it)",
    )
    parser.add_argument("--json", action="store_true", help="print the facts as JSON instead of a table")
    parser.add_argument(
        "--remeasure",
        action="store_true",
        help="time bf16 against fp32 and the int8 kernels again, and keep the new timings for `labkit serve`",
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from labkit.info import machine_facts, model_facts
    from labkit.models import load_model
    from labkit.sim.hardware import measure_bandwidth

    model = load_model(args.model, device=args.device, dtype=args.dtype)
    bandwidth = args.bandwidth * 1e9 if args.bandwidth else measure_bandwidth(device=model.device)
    facts = {**machine_facts(model, remeasure=args.remeasure), **model_facts(model, bandwidth)}
    if args.json:
        print_json(facts)
        return 0
    for key, value in facts.items():
        shown = f"{value:,.1f}" if isinstance(value, float) else (f"{value:,}" if isinstance(value, int) else value)
        print(f"{key:>40}: {shown}")
    print("  (decode bound = weight bytes ÷ bandwidth: each new token reads every weight once)")
    if model.dtype == torch.bfloat16 and model.device.type == "cpu" and not model.prepacked:
        print(
            "  (bf16 halves the weight memory, but this CPU has no packed bf16 kernels: expect no speed-up "
            "over fp32, often a slow-down)"
        )
    return 0
