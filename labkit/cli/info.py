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


def model_facts(model, bandwidth: float) -> dict:
    """The numbers `labkit info` prints, as a dict."""
    from labkit.engine.config import EngineConfig
    from labkit.kv.pool_sizing import kv_pool_size

    cfg = model.config
    weight_bytes = model.weight_bytes()
    defaults = EngineConfig()
    kv_bytes = cfg.kv_bytes_per_token(model.dtype)
    useful_tokens = defaults.max_num_seqs * cfg.max_position_embeddings
    _, pool = kv_pool_size(kv_bytes, defaults.block_size, model.device, defaults.gpu_memory_utilization, useful_tokens)
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
        "KV pool at the engine's defaults": pool,
    }


def machine_facts(model, remeasure: bool = False) -> dict:
    """Which kernels this machine runs the model's matmuls on, and why (CPU name, ISA, threads); what
    `labkit serve` computes in, from the measurements kept for this machine (taken again if ``remeasure``)."""
    import torch

    from labkit.device import cpu_features, cpu_threads
    from labkit.serve.dtype import choose_serving_dtype

    facts: dict = {}
    if model.device.type == "cpu":
        facts.update({key: _yes_no(value) for key, value in cpu_features().items()})
        threads, why = cpu_threads()
        if threads != torch.get_num_threads():
            why = "set by the caller"
        facts["torch threads"] = f"{torch.get_num_threads()} ({why}; LABKIT_THREADS=N overrides)"
    facts["matmuls"] = model.matmul.describe()
    facts["labkit serve computes in"] = choose_serving_dtype(model.device, remeasure=remeasure).describe()
    if model.device.type == "cpu":
        from labkit.engine.int8_choice import choose_int8_backend

        backend = choose_int8_backend(remeasure=remeasure)
        facts["--quantization int8 runs on"] = backend.reason if backend.works else f"nothing: {backend.reason}"
    return facts


def _yes_no(value):
    return {True: "yes", False: "no", None: "unknown"}.get(value, value) if not isinstance(value, str) else value
