"""Show the device, the model, its size, KV bytes per token and the single-stream decode bound."""

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default", help="'default', a checkpoint folder or a cached hub id")
    parser.add_argument("--device", default=None, help="cpu, cuda, mps (default: labkit's choice)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16, float16")
    parser.add_argument("--bandwidth", type=float, default=None,
                        help="memory bandwidth in GB/s for the decode bound (default: measure it)")


def run(args: argparse.Namespace) -> int:
    from labkit.models import load_model

    model = load_model(args.model, device=args.device, dtype=args.dtype)
    bandwidth = args.bandwidth * 1e9 if args.bandwidth else measure_bandwidth(device=model.device)
    for key, value in model_facts(model, bandwidth).items():
        shown = f"{value:,.1f}" if isinstance(value, float) else (f"{value:,}" if isinstance(value, int) else value)
        print(f"{key:>40}: {shown}")
    print("  (decode bound = weight bytes ÷ bandwidth: each new token reads every weight once)")
    return 0
