"""The schedule of a run as a picture: one row per request, coloured by what it did when.

Read from a :class:`~labkit.trace.Trace` alone, so the real engine and the simulator
draw alike. Per step, a request that computed tokens was in **prefill** (it has not emitted a
token since it was admitted, or readmitted to recompute after a preemption) or **decode**; a request that had
arrived but was not in the step was **waiting** (never run yet) or **preempted** (thrown
out and waiting to recompute). Ticks mark each output token, so a stall shows as a gap.

:func:`plot_static_timeline` draws static batching from answer lengths alone, before any
engine exists (lab 3): one row per request, one column per decode step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from labkit.trace import Trace
from labkit.viz._axes import axes_or_new

KINDS = ("waiting", "prefill", "decode", "preempted")
COLOURS = {"waiting": "#d9d9d9", "prefill": "#e6862e", "decode": "#3a78b5", "preempted": "#c62828", "padded": "#bdbdbd"}
Axis = Literal["time", "step"]


@dataclass(frozen=True)
class Segment:
    """A stretch of one request's life in one state, from ``start`` to ``end`` (seconds or step numbers)."""

    request_id: str
    start: float
    end: float
    kind: str  # one of KINDS


def _step_kinds(trace: Trace) -> list[dict[str, str]]:
    """For every step, the state of each request alive during it (request id -> kind).

    A request that computes in a step is in prefill until the step that emits its first token, and
    again after a preemption until the step that emits its next one; otherwise it decodes. This is
    read from the token times, not from counting the tokens computed: with prefix caching a request
    computes fewer tokens than its prompt holds, and the trace does not say how many each one found.
    """
    requests = {r.request_id: r for r in trace.requests}
    first_start = trace.steps[0].start if trace.steps else 0.0
    # tokens emitted so far: a windowed trace's requests may have emitted some before its first step
    emitted = {rid: sum(t <= first_start for t in r.token_times) for rid, r in requests.items()}
    prefilling = {rid for rid in requests if not emitted[rid]}
    ever_ran, thrown_out = set(), set()
    kinds = []
    for step in trace.steps:
        for rid in step.preempted:
            prefilling.add(rid)
            thrown_out.add(rid)
        now: dict[str, str] = {}
        for rid, record in requests.items():
            if rid in step.scheduled:
                now[rid] = "prefill" if rid in prefilling else "decode"
                before, times = emitted[rid], record.token_times
                while emitted[rid] < len(times) and times[emitted[rid]] <= step.end:
                    emitted[rid] += 1
                if emitted[rid] > before:
                    prefilling.discard(rid)
                ever_ran.add(rid)
                thrown_out.discard(rid)
            elif record.arrival_time <= step.start and (record.finish_time is None or record.finish_time > step.start):
                if rid in thrown_out:
                    now[rid] = "preempted"
                elif rid not in ever_ran:
                    now[rid] = "waiting"
        kinds.append(now)
    return kinds


def request_segments(trace: Trace, x: Axis = "time") -> list[Segment]:
    """Every request's states as segments, merged where a state lasts several steps in a row.

    With ``x="time"`` segments run from step start to step end in seconds (a first wait
    starts at the arrival); with ``x="step"`` step ``i`` covers ``[i, i + 1)``.
    """
    if x not in ("time", "step"):
        raise ValueError(f"x must be 'time' or 'step', got {x!r}")
    arrivals = {r.request_id: r.arrival_time for r in trace.requests}
    open_segments: dict[str, Segment] = {}
    last_step: dict[str, int] = {}
    done: list[Segment] = []
    for index, (step, kinds) in enumerate(zip(trace.steps, _step_kinds(trace))):
        start, end = (step.start, step.end) if x == "time" else (index, index + 1)
        for rid, kind in kinds.items():
            current = open_segments.get(rid)
            if current is not None and current.kind == kind and last_step[rid] == index - 1:
                open_segments[rid] = Segment(rid, current.start, end, kind)
            else:
                if current is not None:
                    done.append(current)
                first = x == "time" and current is None and kind == "waiting"
                open_segments[rid] = Segment(rid, min(arrivals[rid], start) if first else start, end, kind)
            last_step[rid] = index
    done.extend(open_segments.values())
    order = {rid: i for i, rid in enumerate(arrivals)}
    return sorted(done, key=lambda s: (order[s.request_id], s.start))


def plot_timeline(
    trace: Trace,
    ax: Axes | None = None,
    x: Axis = "time",
    max_requests: int | None = 40,
    show_tokens: bool = True,
    title: str | None = None,
) -> Axes:
    """A Gantt chart of the run: one row per request (first arrival on top), coloured by state.

    ``max_requests`` keeps the first requests only (None: all). Ticks mark output tokens
    (time axis only); a black cross marks each preemption.
    """
    if not trace.steps:
        raise ValueError("the trace has no steps to draw; run the engine (or simulator) first")
    ids = [r.request_id for r in trace.requests][:max_requests]
    rows = {rid: row for row, rid in enumerate(ids)}
    ax = axes_or_new(ax, (10, 0.9 + 0.22 * len(ids)))
    spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for segment in request_segments(trace, x):
        if segment.request_id in rows:
            spans.setdefault((segment.request_id, segment.kind), []).append(
                (segment.start, segment.end - segment.start)
            )
    for (rid, kind), bars in spans.items():
        ax.broken_barh(bars, (rows[rid] - 0.4, 0.8), facecolors=COLOURS[kind], linewidth=0)
    if show_tokens and x == "time":
        for record in trace.requests[: len(ids)]:
            ax.plot(
                record.token_times,
                [rows[record.request_id]] * record.output_len,
                "|",
                color="white",
                markersize=4,
                markeredgewidth=0.6,
            )
    for index, step in enumerate(trace.steps):
        for rid in step.preempted:
            if rid in rows:
                ax.plot(step.start if x == "time" else index, rows[rid], "x", color="black")
    ax.set_ylim(len(ids) - 0.5, -0.5)
    ax.set_yticks(range(len(ids)), ids, fontsize=8 if len(ids) > 20 else 9)
    ax.set_xlabel("time (s)" if x == "time" else "step")
    ax.set_ylabel("request")
    shown = {kind for _, kind in spans}
    handles = [Patch(color=COLOURS[k], label=k) for k in KINDS if k in shown]
    if any(s.preempted for s in trace.steps):
        handles.append(Line2D([], [], marker="x", linestyle="", color="black", label="preemption"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=9)
    ax.set_title(title or _default_title(trace))
    return ax


def plot_batch_composition(
    trace: Trace,
    ax: Axes | None = None,
    unit: Literal["sequences", "tokens"] = "sequences",
    budget: int | None = None,
    title: str | None = None,
) -> Axes:
    """What each step computed, as stacked bars: decodes, prefills (and padded slots, in sequences).

    With ``unit="tokens"`` the bars count tokens and ``budget`` draws the per-step token
    limit; with ``unit="sequences"`` a line shows how many requests were waiting.
    """
    if unit not in ("sequences", "tokens"):
        raise ValueError(f"unit must be 'sequences' or 'tokens', got {unit!r}")
    if not trace.steps:
        raise ValueError("the trace has no steps to draw; run the engine (or simulator) first")
    ax = axes_or_new(ax, (10, 3))
    steps = range(len(trace.steps))
    kinds = _step_kinds(trace)
    if unit == "tokens":
        layers = {
            "decode": [s.num_decode_tokens for s in trace.steps],
            "prefill": [s.num_prefill_tokens for s in trace.steps],
        }
    else:
        layers = {
            "decode": [sum(k == "decode" for k in ks.values()) for ks in kinds],
            "prefill": [sum(k == "prefill" for k in ks.values()) for ks in kinds],
            "padded": [max(0, s.slots_held - s.num_active) for s in trace.steps],
        }
    bottom = [0] * len(trace.steps)
    for kind, heights in layers.items():
        ax.bar(steps, heights, bottom=bottom, width=1.0, color=COLOURS[kind], label=kind, linewidth=0)
        bottom = [b + h for b, h in zip(bottom, heights)]
    if unit == "sequences":
        ax.step(steps, [s.num_waiting for s in trace.steps], where="mid", color="black", linewidth=1, label="waiting")
    if budget is not None:
        ax.axhline(budget, color="black", linestyle="--", linewidth=1, label=f"budget ({budget})")
    ax.set_xlabel("step")
    ax.set_ylabel(unit)
    ax.set_xlim(-0.5, len(trace.steps) - 0.5)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=9)
    ax.set_title(title or _default_title(trace))
    return ax


def _default_title(trace: Trace) -> str:
    """ "17 steps: 2 with prefill, 15 decode only", so the count agrees with what a lab prints beside it."""
    policy = trace.meta.get("policy")
    with_prefill = sum(step.num_prefill_tokens > 0 for step in trace.steps)
    steps = f"{len(trace.steps)} steps: {with_prefill} with prefill, {len(trace.steps) - with_prefill} decode only"
    return f"{policy}: {steps}" if policy else steps


# --- static batching from answer lengths alone (lab 3) ----------------------------------------
# Requests are batched in arrival order, ``batch_size`` at a time; a batch runs until its longest
# member has all its tokens, and only then does the next batch start. Each request's row shows the
# steps it waited outside, the steps it produced tokens, and the steps it held its slot while
# producing nothing (padding, in red: the waste continuous batching removes).

WAITING, USEFUL, PADDED = "#e8e8e8", "tab:blue", "tab:red"


def batch_spans(output_lens: Sequence[int], batch_size: int) -> list[tuple[int, int, int]]:
    """(first step, useful steps, padded steps) for each request, batching in arrival order."""
    spans = []
    start = 0
    for first in range(0, len(output_lens), batch_size):
        batch = list(output_lens[first : first + batch_size])
        longest = max(batch)
        spans += [(start, length, longest - length) for length in batch]
        start += longest
    return spans


def plot_static_timeline(
    output_lens: Sequence[int], batch_size: int, title: str = "", measured_seconds: float | None = None
):
    """Draw the timeline; ``measured_seconds`` (wall time of the whole run, if it was run) goes on the axis."""
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
    ax.set_title(
        title
        or f"static batching, batch size {batch_size}: {useful} useful slot-steps, {padded} padded "
        f"({useful / (useful + padded):.0%} utilisation)"
    )
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in (WAITING, USEFUL, PADDED)]
    ax.legend(
        handles,
        ["waiting for its batch", "producing tokens", "holding a slot, padded"],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.22),
        ncol=3,
        fontsize=8,
    )
    fig.tight_layout()
    return fig
