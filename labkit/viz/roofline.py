"""The roofline: the most arithmetic per second a machine can deliver at each arithmetic intensity.

Below the ridge (few FLOPs per byte, like decoding one token for a small batch) memory
bandwidth is the roof; above it (a long prefill, a large batch) the arithmetic rate is.
Measured points show where real work lands and how close to its roof it gets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes

from labkit.viz._axes import axes_or_new


@dataclass(frozen=True)
class RooflinePoint:
    """One measured piece of work: its FLOPs per byte moved and the FLOP/s it achieved."""

    label: str
    intensity: float  # FLOP / byte
    flops_per_s: float


def plot_roofline(peak_flops_per_s: float, bandwidth_bytes_per_s: float, points: Sequence[RooflinePoint] = (),
                  ax: Axes | None = None, title: str | None = None) -> Axes:
    """The roof ``min(peak, bandwidth x intensity)`` on log-log axes, the ridge marked, points on top."""
    if peak_flops_per_s <= 0 or bandwidth_bytes_per_s <= 0:
        raise ValueError("the peak FLOP rate and the bandwidth must both be positive numbers (FLOP/s, bytes/s)")
    for point in points:
        if point.intensity <= 0 or point.flops_per_s <= 0:
            raise ValueError(f"point {point.label!r} needs a positive intensity and FLOP rate to sit on log axes")
    ax = axes_or_new(ax, (6, 4))
    ridge = peak_flops_per_s / bandwidth_bytes_per_s
    intensities = [p.intensity for p in points] + [ridge]
    grid = np.geomspace(min(intensities) / 4, max(intensities) * 4, 200)
    ax.loglog(grid, np.minimum(peak_flops_per_s, bandwidth_bytes_per_s * grid), color="black", linewidth=1.5,
              label="roof")
    ax.axvline(ridge, color="grey", linestyle=":", linewidth=1)
    ax.annotate(f"ridge {ridge:.3g} FLOP/B", (ridge, peak_flops_per_s), textcoords="offset points",
                xytext=(4, -12), fontsize=8, color="grey")
    for index, point in enumerate(points):
        ax.loglog(point.intensity, point.flops_per_s, "o", color=f"C{index % 10}", label=point.label)
    ax.set_xlabel("arithmetic intensity (FLOP per byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(title or f"roof: {bandwidth_bytes_per_s / 1e9:.3g} GB/s, {peak_flops_per_s / 1e12:.3g} TFLOP/s")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.2)
    return ax
