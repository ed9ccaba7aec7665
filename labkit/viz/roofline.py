"""The roofline: which of a machine's two rates a forward pass waits for, with measured points on it.

A pass reads every weight once and does about 2 x parameters FLOPs per token. With B tokens
in the pass, it lasts at least max(weight bytes / bandwidth, B x 2N / FLOP rate), so tokens
per second can be no more than min(B x bandwidth / weight bytes, FLOP rate / 2N): a rising
line (bandwidth-bound, where decode lives) that meets a flat roof (arithmetic-bound, where
long prefills live). The knee is at B = FLOP rate x weight bytes / (bandwidth x 2N).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes

from labkit.viz._axes import axes_or_new


@dataclass(frozen=True)
class Roofline:
    """A machine's two rates and a model's two sizes: everything the bound needs."""

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


def plot_roofline(
    roofline: Roofline,
    batch_sizes: Sequence[int],
    measured: Sequence[float],
    marks: dict[str, tuple[float, float]] | None = None,
    title: str = "",
    ax: Axes | None = None,
):
    """Measured tokens/s against tokens per pass, under the bound; ``marks`` labels extra points. Returns the Figure."""
    ax = axes_or_new(ax, (7, 4.2))
    marks = marks or {}
    low = min(list(batch_sizes) + [1]) / 1.5
    high = max(list(batch_sizes) + [x for x, _ in marks.values()]) * 1.5
    grid = np.geomspace(low, high, 200)
    ax.plot(grid, [roofline.bound(b) for b in grid], color="black", lw=2, label="bound: min(B·bandwidth/W, rate/2N)")
    ax.axvline(roofline.knee, color="grey", ls="--", lw=1)
    ax.text(
        roofline.knee * 1.05, roofline.bound(roofline.knee) * 0.08, f"knee ≈ {roofline.knee:.0f} tokens", color="grey"
    )
    ax.plot(batch_sizes, measured, "o-", color="tab:blue", label="measured: one pass of B tokens")
    for label, (x, y) in marks.items():
        ax.plot([x], [y], "s", ms=9, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens in one forward pass (batch size B)")
    ax.set_ylabel("tokens per second")
    ax.set_title(title or "Which rate does a pass wait for? (measured on this machine)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return ax.figure
