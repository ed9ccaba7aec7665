"""The picture of static batching: one row per request, one column per decode step.

Requests are batched in arrival order, ``batch_size`` at a time; a batch runs until its longest
member has all its tokens, and only then does the next batch start. Each request's row shows the
steps it waited outside, the steps it produced tokens, and the steps it held its slot while
producing nothing (padding).
"""

from __future__ import annotations

from collections.abc import Sequence

WAITING, USEFUL, PADDED = "#e8e8e8", "tab:blue", "tab:red"


def batch_spans(output_lens: Sequence[int], batch_size: int) -> list[tuple[int, int, int]]:
    """(first step, useful steps, padded steps) for each request, batching in arrival order."""
    spans = []
    start = 0
    for first in range(0, len(output_lens), batch_size):
        batch = list(output_lens[first:first + batch_size])
        longest = max(batch)
        spans += [(start, length, longest - length) for length in batch]
        start += longest
    return spans


def plot_static_timeline(output_lens: Sequence[int], batch_size: int, title: str = "",
                         measured_seconds: float | None = None):
    """Draw the timeline; ``measured_seconds`` (wall time of the whole run, if it was run) goes on the axis."""
    import matplotlib.pyplot as plt

    spans = batch_spans(output_lens, batch_size)
    total_steps = max(start + useful + padded for start, useful, padded in spans)
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(spans) + 2.0))
    for row, (start, useful, padded) in enumerate(spans):
        for left, width, colour in ((0, start, WAITING), (start, useful, USEFUL), (start + useful, padded, PADDED)):
            if width:
                ax.broken_barh([(left, width)], (row - 0.4, 0.8), color=colour)
    for first in range(batch_size, len(spans), batch_size):
        ax.axhline(first - 0.5, color="black", lw=0.8)
    ax.set_ylim(len(spans) - 0.5, -0.5)
    ax.set_xlim(0, total_steps)
    ax.set_ylabel("request (arrival order)")
    ax.set_xlabel("decode step")
    if measured_seconds is not None:
        ax.set_xlabel(f"decode step ({total_steps} steps; the run took {measured_seconds:.1f} s on this machine)")
    useful = sum(u for _, u, _ in spans)
    padded = sum(p for _, _, p in spans)
    ax.set_title(title or f"static batching, batch size {batch_size}: {useful} useful slot-steps, {padded} padded "
                          f"({useful / (useful + padded):.0%} utilisation)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in (WAITING, USEFUL, PADDED)]
    ax.legend(handles, ["waiting for its batch", "producing tokens", "holding a slot, padded"],
              loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, fontsize=8)
    fig.tight_layout()
    return fig
