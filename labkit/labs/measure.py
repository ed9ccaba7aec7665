"""Timing on this machine, and the roofline that says which of its two rates a pass waits for.

A forward pass reads every weight once and does about 2 x parameters FLOPs per token. With
B tokens in the pass, it lasts at least max(weight bytes / bandwidth, B x 2N / FLOP rate),
so tokens per second can be no more than min(B x bandwidth / weight bytes, FLOP rate / 2N):
a rising line (bandwidth-bound, where decode lives) that meets a flat roof (arithmetic-bound,
where long prefills live). The knee is at B = FLOP rate x weight bytes / (bandwidth x 2N).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from labkit.kv.attention import attention
from labkit.models.llama import LlamaModel
from labkit.sim.hardware import measure_bandwidth, measure_matmul_rate


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(work: Callable[[], object], repeats: int = 3, device: torch.device | None = None,
                   warmup: bool = True) -> float:
    """Median wall time of ``repeats`` calls of ``work``, after one untimed warm-up call if ``warmup``."""
    device = device or torch.device("cpu")
    if warmup:
        work()
    times = []
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        work()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclass(frozen=True)
class Roofline:
    """This machine's two rates and a model's two sizes: everything the bound needs."""

    bandwidth: float  # bytes per second
    flops: float  # FLOP per second for matrix products in the model's dtype
    weight_bytes: float
    flops_per_token: float  # about 2 x parameters

    @property
    def knee(self) -> float:
        """Tokens per pass where reading the weights and doing the arithmetic take equally long."""
        return self.flops * self.weight_bytes / (self.bandwidth * self.flops_per_token)

    def bound(self, tokens_per_pass: float) -> float:
        """The most tokens per second a pass of this many tokens can reach."""
        return min(tokens_per_pass * self.bandwidth / self.weight_bytes, self.flops / self.flops_per_token)

    def side(self, tokens_per_pass: float) -> str:
        return "bandwidth-bound" if tokens_per_pass < self.knee else "arithmetic-bound"


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


def plot_roofline(roofline: Roofline, batch_sizes: Sequence[int], measured: Sequence[float],
                  marks: dict[str, tuple[float, float]] | None = None, title: str = ""):
    """Measured tokens/s against tokens per pass, under the bound; ``marks`` labels extra points."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    low, high = min(list(batch_sizes) + [1]) / 1.5, max(list(batch_sizes) + [x for x, _ in (marks or {}).values()]) * 1.5
    grid = torch.logspace(torch.log10(torch.tensor(low)), torch.log10(torch.tensor(high)), 200).tolist()
    ax.plot(grid, [roofline.bound(b) for b in grid], color="black", lw=2, label="bound: min(B·bandwidth/W, rate/2N)")
    ax.axvline(roofline.knee, color="grey", ls="--", lw=1)
    ax.text(roofline.knee * 1.05, roofline.bound(roofline.knee) * 0.08, f"knee ≈ {roofline.knee:.0f} tokens",
            color="grey")
    ax.plot(batch_sizes, measured, "o-", color="tab:blue", label="measured: one pass of B tokens")
    for label, (x, y) in (marks or {}).items():
        ax.plot([x], [y], "s", ms=9, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens in one forward pass (batch size B)")
    ax.set_ylabel("tokens per second")
    ax.set_title(title or "Which rate does a pass wait for? (measured on this machine)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig
