"""Pictures of a serving run: who ran when, which blocks each sequence owns, latency, the roofline.

Each function draws on a matplotlib Axes (a new one if none is given) and returns it (or
the Figure), so a notebook or the book can compose, restyle and save the picture; nothing
here calls ``plt.show``. Everything reads a :class:`~labkit.trace.Trace`, a metrics
summary or plain numbers, so runs of the real engine and of the simulator draw the same way.

- :mod:`~labkit.viz.timeline`: one row per request (waiting, prefill, decode, preempted),
  or the batch composition of each step; static batching drawn from answer lengths alone;
- :mod:`~labkit.viz.blocks`: the KV block map, coloured by owner, and a slider over steps;
- :mod:`~labkit.viz.latency`: TTFT/ITL percentiles and throughput against arrival rate,
  and every token gap over time;
- :mod:`~labkit.viz.roofline`: tokens/s against tokens per pass under a machine's roofline;
- :mod:`~labkit.viz.serving`: a live server's gauges (running, waiting, KV usage) over time;
- :mod:`~labkit.viz.svg`: figures shown as SVG with their words as text (the book's figures).
"""

from labkit.viz.blocks import BlockSnapshot, block_map_slider, plot_block_map, plot_block_maps, snapshot_blocks
from labkit.viz.latency import plot_latency_vs_rate, plot_throughput_vs_rate, plot_token_gaps
from labkit.viz.roofline import Roofline, plot_roofline
from labkit.viz.serving import plot_server_gauges
from labkit.viz.svg import use_svg_figures
from labkit.viz.timeline import (
    Segment,
    batch_spans,
    plot_batch_composition,
    plot_static_timeline,
    plot_timeline,
    request_segments,
)

__all__ = [
    "BlockSnapshot",
    "Roofline",
    "Segment",
    "batch_spans",
    "block_map_slider",
    "plot_batch_composition",
    "plot_block_map",
    "plot_block_maps",
    "plot_latency_vs_rate",
    "plot_roofline",
    "plot_server_gauges",
    "plot_static_timeline",
    "plot_throughput_vs_rate",
    "plot_timeline",
    "plot_token_gaps",
    "request_segments",
    "snapshot_blocks",
    "use_svg_figures",
]
