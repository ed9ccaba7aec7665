"""Show the device, the CPU's kernel paths, the model, its size, KV bytes per token and the decode bound."""

from __future__ import annotations

import argparse

from labkit.sim.hardware import measure_bandwidth


def model_facts(model, bandwidth: float) -> dict:
    """The numbers `labkit info` prints, as a dict."""
    cfg = model.config
    weight_bytes = model.weight_bytes()
    return {
        "device": str(model.device),
        "dtype": str(model.dtype).removeprefix("torch."),
        "model": cfg.name,
        "parameters": model.num_parameters(),
        "weight bytes": weight_bytes,
        "layers / heads / kv heads / head dim": f"{cfg.num_layers} / {cfg.num_heads} / "
                                                f"{cfg.num_kv_heads} / {cfg.head_dim}",
        "KV bytes per token": cfg.kv_bytes_per_token(model.dtype),
        "bandwidth (GB/s)": bandwidth / 1e9,
        "single-stream decode bound (tokens/s)": bandwidth / weight_bytes,
    }


def machine_facts(model) -> dict:
    """Which kernels this machine runs the model's matmuls on, and why (CPU name, ISA, threads)."""
    import torch

    from labkit.device import cpu_features, cpu_threads

    facts: dict = {}
    if model.device.type == "cpu":
        facts.update({key: _yes_no(value) for key, value in cpu_features().items()})
        threads, why = cpu_threads()
        if threads != torch.get_num_threads():
            why = "set by the caller"
        facts["torch threads"] = f"{torch.get_num_threads()} ({why}; LABKIT_THREADS=N overrides)"
    facts["matmuls"] = model.matmul.describe()
    return facts


def _yes_no(value):
    return {True: "yes", False: "no", None: "unknown"}.get(value, value) if not isinstance(value, str) else value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default", help="'default', a checkpoint folder or a cached hub id")
    parser.add_argument("--device", default=None, help="cpu, cuda, mps (default: labkit's choice)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16, float16")
    parser.add_argument("--bandwidth", type=float, default=None,
                        help="memory bandwidth in GB/s for the decode bound (default: measure it)")


def run(args: argparse.Namespace) -> int:
    import torch

    from labkit.models import load_model

    model = load_model(args.model, device=args.device, dtype=args.dtype)
    bandwidth = args.bandwidth * 1e9 if args.bandwidth else measure_bandwidth(device=model.device)
    facts = {**machine_facts(model), **model_facts(model, bandwidth)}
    for key, value in facts.items():
        shown = f"{value:,.1f}" if isinstance(value, float) else (f"{value:,}" if isinstance(value, int) else value)
        print(f"{key:>40}: {shown}")
    print("  (decode bound = weight bytes ÷ bandwidth: each new token reads every weight once)")
    if model.dtype == torch.bfloat16 and model.device.type == "cpu" and not model.prepacked:
        print("  (bf16 halves the weight memory, but this CPU has no packed bf16 kernels: expect no speed-up "
              "over fp32, often a slow-down)")
    return 0
