"""What `labkit info` reports: the device, the CPU's kernel paths, the model, its size, KV bytes per token
and the decode bound, as dicts (the command itself is :mod:`labkit.cli.info`)."""

from __future__ import annotations


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
    from labkit.serving_dtype import choose_serving_dtype

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
        from labkit.models.int8_linear import choose_int8_backend

        backend = choose_int8_backend(remeasure=remeasure)
        facts["--quantization int8 runs on"] = backend.reason if backend.works else f"nothing: {backend.reason}"
    return facts


def _yes_no(value):
    return {True: "yes", False: "no", None: "unknown"}.get(value, value) if not isinstance(value, str) else value
