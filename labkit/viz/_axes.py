"""The one helper every plot shares: draw on the Axes given, or on a fresh one."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.axes import Axes


def axes_or_new(ax: Axes | None, figsize: tuple[float, float]) -> Axes:
    """``ax`` itself, or the Axes of a new Figure of ``figsize`` inches."""
    if ax is not None:
        return ax
    _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax
