"""Latency and throughput against load, and every token gap of a run over time.

The first two plots take runs at several arrival rates, each summarised by
:func:`labkit.metrics.summarize`, grouped by policy: ``{"static": {1.0: summary, ...}, ...}``.
Percentiles are solid (p50) and dashed (p99), one colour per policy, so the tail and the
median of each policy read at a glance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.axes import Axes

from labkit.metrics import Summary
from labkit.trace import Trace
from labkit.viz._axes import axes_or_new

RunsByPolicy = Mapping[str, Mapping[float, Summary]]
LINESTYLES = {50: "-", 90: "-.", 99: "--"}
METRICS = ("ttft", "tpot", "itl", "e2el", "queue")


def plot_latency_vs_rate(
    runs: RunsByPolicy,
    metric: str = "ttft",
    percentiles: Sequence[float] = (50, 99),
    ax: Axes | None = None,
    slo_ms: float | None = None,
    log: bool = True,
) -> Axes:
    """A latency metric (ms) at each percentile against arrival rate, one colour per policy."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; use one of {', '.join(METRICS)}")
    ax = axes_or_new(ax, (6, 3.5))
    for colour, (policy, by_rate) in enumerate(runs.items()):
        rates = sorted(by_rate)
        for q in percentiles:
            values = [by_rate[rate].distributions()[metric].percentile(q) for rate in rates]
            ax.plot(rates, values, LINESTYLES.get(q, ":"), marker="o", color=f"C{colour}", label=f"{policy} p{q:g}")
    if slo_ms is not None:
        ax.axhline(slo_ms, color="black", linewidth=1, linestyle=":", label=f"SLO {slo_ms:g} ms")
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("arrival rate (requests/s)")
    ax.set_ylabel(f"{metric.upper()} (ms)")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return ax


def plot_throughput_vs_rate(runs: RunsByPolicy, ax: Axes | None = None) -> Axes:
    """Output tokens per second against arrival rate, one line per policy."""
    ax = axes_or_new(ax, (6, 3.5))
    for colour, (policy, by_rate) in enumerate(runs.items()):
        rates = sorted(by_rate)
        ax.plot(
            rates, [by_rate[rate].output_throughput for rate in rates], marker="o", color=f"C{colour}", label=policy
        )
    ax.set_xlabel("arrival rate (requests/s)")
    ax.set_ylabel("output tokens/s")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return ax


def plot_token_gaps(
    trace: Trace,
    ax: Axes | None = None,
    request_ids: Sequence[str] | None = None,
    label: str | None = None,
    colour: str | None = None,
) -> Axes:
    """Every gap between two tokens of a request (ms), placed at the time of the later token.

    A step that freezes the running users shows as a spike: all their gaps jump at once.
    ``request_ids`` limits the plot to some requests (for example the ones already running).
    """
    ax = axes_or_new(ax, (8, 3))
    wanted = None if request_ids is None else set(request_ids)
    times, gaps = [], []
    for record in trace.requests:
        if wanted is not None and record.request_id not in wanted:
            continue
        for before, after in zip(record.token_times, record.token_times[1:]):
            times.append(after)
            gaps.append(1000.0 * (after - before))
    ax.scatter(times, gaps, s=6, label=label, color=colour)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("gap between tokens (ms)")
    ax.grid(True, alpha=0.3)
    if label:
        ax.legend(fontsize=8)
    return ax
