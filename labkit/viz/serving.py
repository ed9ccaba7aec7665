"""A server's gauges over time: requests running and waiting, and how full the KV cache is.

This is the panel a vLLM dashboard opens with (``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``), drawn from scrapes of
``/metrics`` taken while a load runs (:func:`labkit.serve.watch.watch`). Requests are counted
on the left axis, the cache in percent on the right, against the same seconds: a queue that
builds while the cache is full is the picture of a server past its capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator

from labkit.viz._axes import axes_or_new


class GaugeReading(Protocol):
    """One scrape's gauges (:class:`labkit.serve.watch.GaugeSample` is one), read only: a frozen dataclass fits."""

    @property
    def t_s(self) -> float: ...
    @property
    def running(self) -> float: ...
    @property
    def waiting(self) -> float: ...
    @property
    def kv_usage(self) -> float: ...


def plot_server_gauges(samples: Sequence[GaugeReading], ax: Axes | None = None) -> Axes:
    """Running and waiting requests (left axis) and KV-cache usage in % (right axis) against time.

    Returns the left Axes; the KV-cache axis is its twin, in ``ax.figure.axes`` after it.
    """
    ax = axes_or_new(ax, (7, 3))
    times = [sample.t_s for sample in samples]
    ax.plot(times, [sample.running for sample in samples], color="C0", label="running")
    ax.plot(times, [sample.waiting for sample in samples], color="C1", label="waiting")
    ax.set_xlabel("time since watching began (s)")
    ax.set_ylabel("requests")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # requests come whole
    ax.grid(True, alpha=0.3)
    cache = ax.twinx()
    cache.plot(
        times,
        [100.0 * sample.kv_usage for sample in samples],
        color="C2",
        linestyle="--",
        label="KV cache usage",
    )
    cache.set_ylabel("KV cache usage (%)")
    cache.set_ylim(0, 105)
    lines = ax.get_lines() + cache.get_lines()
    ax.legend(
        lines,
        [line.get_label() for line in lines],
        fontsize=8,
        ncol=3,
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),  # above the plot, where no line runs
        frameon=False,
    )
    return ax
