"""Timing on this machine: a median over runs, this machine's roofline, and tokens/s against batch size.

The roofline itself (the bound, the knee, the plot) is :mod:`labkit.viz.roofline`; this
module measures what goes on it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from labkit.device import synchronize
from labkit.kv.attention import attention
from labkit.models.llama import LlamaModel
from labkit.sim.hardware import measure_bandwidth, measure_matmul_rate
from labkit.viz.roofline import Roofline


def median_seconds(
    work: Callable[[], object], repeats: int = 3, device: torch.device | None = None, warmup: bool = True
) -> float:
    """Median wall time of ``repeats`` calls of ``work``, after one untimed warm-up call if ``warmup``."""
    device = device or torch.device("cpu")
    if warmup:
        work()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        work()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_roofline(model: LlamaModel, copy_megabytes: float = 128, matmul_size: int = 768) -> Roofline:
    """Measure this machine's bandwidth (a big copy) and matmul rate, and pair them with the model's sizes."""
    device = model.device
    return Roofline(
        bandwidth=measure_bandwidth(copy_megabytes, device),
        flops=measure_matmul_rate(matmul_size, model.dtype, device),
        weight_bytes=float(model.weight_bytes()),
        flops_per_token=2.0 * model.num_parameters(),
    )


def tokens_per_second_vs_batch(model: LlamaModel, batch_sizes: Sequence[int], repeats: int = 3) -> list[float]:
    """Tokens per second of one forward pass holding B tokens, each the first token of its own sequence.

    This is a decode step for B sequences with nothing cached: every token sees only itself,
    so the cost is the weights and the per-token arithmetic, which is what the roofline models.
    """
    rates = []
    for batch in batch_sizes:
        ids = torch.randint(100, 1000, (batch,), device=model.device)
        positions = torch.zeros(batch, dtype=torch.long, device=model.device)
        only_itself = torch.eye(batch, dtype=torch.bool, device=model.device)

        def attend(layer, q, k, v, mask=only_itself):
            return attention(q, k, v, mask)

        seconds = median_seconds(lambda: model.forward(ids, positions, attend), repeats, model.device)
        rates.append(batch / seconds)
    return rates
