"""How many KV blocks fit, vLLM style: a fraction of device memory, less what is in use now."""

from __future__ import annotations

import torch

from labkit.device import available_ram_bytes

# Without a GPU there is no "device memory" to take a fraction of; the pool takes a fraction of
# the RAM available, but never more than this (vLLM's CPU backend also uses a fixed KV space).
CPU_KV_CACHE_CAP_BYTES = 1024**3


def kv_pool_size(
    bytes_per_token: int,
    block_size: int,
    device: torch.device,
    gpu_memory_utilization: float,
    max_useful_tokens: int,
    kv_cache_dtype: str = "auto",
) -> tuple[int, str]:
    """How many blocks fit, vLLM style: a fraction of device memory, less what is in use now; and why, in words.

    On CUDA, the budget is ``gpu_memory_utilization`` × total memory minus what torch already holds (the
    weights), so call it after loading the model; elsewhere it is that fraction of the RAM available now, capped
    at ``CPU_KV_CACHE_CAP_BYTES``. The pool never exceeds ``max_useful_tokens`` (max_num_seqs × max_model_len).
    ``bytes_per_token`` is in the pool's storage dtype (fp8: 1 byte per value); ``kv_cache_dtype`` only names it.
    ``gpu_memory_utilization`` is in (0, 1], as :class:`~labkit.engine.config.EngineConfig` checks.
    """
    gib = 1024**3
    if device.type == "cuda":
        total = torch.cuda.mem_get_info(device)[1]
        held = torch.cuda.memory_allocated(device)
        budget = gpu_memory_utilization * total - held
        why = f"{gpu_memory_utilization:g} of {total / gib:.1f} GiB of GPU memory less {held / gib:.2f} GiB held"
    else:
        available = available_ram_bytes()
        budget = min(gpu_memory_utilization * available, CPU_KV_CACHE_CAP_BYTES)
        why = f"{gpu_memory_utilization:g} of {available / gib:.1f} GiB of RAM available"
        if budget == CPU_KV_CACHE_CAP_BYTES:
            why += f", capped at {CPU_KV_CACHE_CAP_BYTES / gib:g} GiB on a CPU"
    bytes_per_block = bytes_per_token * block_size
    useful_blocks = -(-max_useful_tokens // block_size)
    num_blocks = min(int(budget // bytes_per_block), useful_blocks)
    if num_blocks < 1:
        raise ValueError(
            f"no room for a single KV block ({bytes_per_block} bytes) with "
            f"gpu_memory_utilization={gpu_memory_utilization}; raise it or pass num_blocks"
        )
    if num_blocks == useful_blocks:
        why = f"enough for max_num_seqs × max_model_len = {max_useful_tokens:,} tokens (room: {why})"
    storage = "" if kv_cache_dtype == "auto" else f" ({kv_cache_dtype})"
    return num_blocks, f"{num_blocks} blocks of {block_size} tokens × {bytes_per_token:,} bytes{storage}: {why}"
