"""The plots in labkit.viz, on small hand-built traces whose right picture is known."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from labkit.metrics import summarize
from labkit.trace import RequestRecord, StepRecord, Trace
from labkit.viz import (
    Roofline,
    batch_spans,
    block_map_slider,
    plot_batch_composition,
    plot_block_map,
    plot_block_maps,
    plot_latency_vs_rate,
    plot_roofline,
    plot_throughput_vs_rate,
    plot_timeline,
    plot_token_gaps,
    request_segments,
    snapshot_blocks,
    use_svg_figures,
)


def step(index, scheduled, prefill=0, preempted=(), slots=None, waiting=0):
    decode = sum(scheduled.values()) - prefill
    return StepRecord(
        index,
        float(index),
        index + 1.0,
        dict(scheduled),
        prefill,
        decode,
        slots if slots is not None else len(scheduled),
        waiting,
        preempted=list(preempted),
    )


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.fixture
def two_requests() -> Trace:
    """'a' (3-token prompt) runs at once; 'b' (2-token prompt) arrives at 0 but waits one step."""
    a = RequestRecord("a", 0.0, 3, first_scheduled_time=0.0, token_times=[1.0, 2.0, 3.0], finish_time=3.0)
    b = RequestRecord("b", 0.0, 2, first_scheduled_time=1.0, token_times=[2.0, 3.0], finish_time=3.0)
    steps = [step(0, {"a": 3}, prefill=3, waiting=1), step(1, {"a": 1, "b": 2}, prefill=2), step(2, {"a": 1, "b": 1})]
    return Trace([a, b], steps, meta={"policy": "continuous"})


def kinds(segments, rid):
    return [(s.kind, s.start, s.end) for s in segments if s.request_id == rid]


def test_segments_on_step_axis(two_requests):
    segments = request_segments(two_requests, x="step")
    assert kinds(segments, "a") == [("prefill", 0, 1), ("decode", 1, 3)]
    assert kinds(segments, "b") == [("waiting", 0, 1), ("prefill", 1, 2), ("decode", 2, 3)]


def test_chunked_prompt_is_prefill_until_fully_cached():
    a = RequestRecord("a", 0.0, 5, 0.0, token_times=[2.0, 3.0], finish_time=3.0)
    trace = Trace([a], [step(0, {"a": 3}, prefill=3), step(1, {"a": 2}, prefill=2), step(2, {"a": 1})])
    assert kinds(request_segments(trace, x="step"), "a") == [("prefill", 0, 2), ("decode", 2, 3)]


def test_preempted_request_waits_then_recomputes_prompt_and_output():
    # 'b' makes one token, is preempted at step 2, then recomputes its 2 + 1 tokens in step 3.
    a = RequestRecord("a", 0.0, 2, 0.0, token_times=[1.0, 2.0, 3.0, 4.0], finish_time=4.0)
    b = RequestRecord("b", 0.0, 2, 0.0, token_times=[1.0, 4.0], finish_time=4.0, num_preemptions=1)
    steps = [
        step(0, {"a": 2, "b": 2}, prefill=4),
        step(1, {"a": 1, "b": 1}),
        step(2, {"a": 1}, preempted=["b"]),
        step(3, {"a": 1, "b": 3}, prefill=3),
    ]
    segments = request_segments(Trace([a, b], steps), x="step")
    assert kinds(segments, "b") == [("prefill", 0, 1), ("decode", 1, 2), ("preempted", 2, 3), ("prefill", 3, 4)]


def test_time_axis_starts_first_wait_at_arrival():
    a = RequestRecord("a", 0.0, 2, 0.0, token_times=[1.0, 2.0], finish_time=2.0)
    b = RequestRecord("b", 0.5, 2, 1.0, token_times=[2.0], finish_time=2.0)
    trace = Trace([a, b], [step(0, {"a": 2}, prefill=2), step(1, {"a": 1, "b": 2}, prefill=2)])
    assert kinds(request_segments(trace, x="time"), "b") == [("prefill", 1.0, 2.0)]  # arrived after step 0 began
    b.arrival_time = 0.0
    assert kinds(request_segments(trace, x="time"), "b")[0] == ("waiting", 0.0, 1.0)


def test_timeline_draws_one_row_per_request(two_requests):
    ax = plot_timeline(two_requests)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]
    assert ax.get_title() == "continuous: 3 steps: 2 with prefill, 1 decode only"
    assert len(ax.collections) == 5  # one per (row, state): a prefill, a decode, b waiting, b prefill, b decode


def test_timeline_refuses_an_empty_trace():
    with pytest.raises(ValueError, match="no steps"):
        plot_timeline(Trace())


def test_batch_composition_stacks_decodes_prefills_and_padding():
    a = RequestRecord("a", 0.0, 2, 0.0, token_times=[1.0], finish_time=1.0)
    b = RequestRecord("b", 0.0, 2, 0.0, token_times=[1.0, 2.0], finish_time=2.0)
    trace = Trace([a, b], [step(0, {"a": 2, "b": 2}, prefill=4), step(1, {"b": 1}, slots=2)])
    ax = plot_batch_composition(trace)
    heights = {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}
    assert heights == {"decode": [0, 1], "prefill": [2, 0], "padded": [0, 1]}
    ax = plot_batch_composition(trace, unit="tokens", budget=4)
    heights = {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}
    assert heights == {"decode": [0, 1], "prefill": [4, 0]}
    with pytest.raises(ValueError, match="unit"):
        plot_batch_composition(trace, unit="blocks")


def test_snapshot_fills_only_the_last_block_partly():
    snap = snapshot_blocks({"s": [5, 6, 7, 53]}, num_blocks=64, block_size=16, lengths={"s": 62})
    assert snap.num_used == 4 and snap.empty_slots == 2
    assert [snap.used_slots[b] for b in (5, 6, 7, 53)] == [16, 16, 16, 14]
    assert snap.owners[53] == "s" and snap.owners[0] is None


@pytest.mark.parametrize(
    "tables, lengths, message",
    [
        ({"a": [1], "b": [1]}, None, "owned by both"),
        ({"a": [99]}, None, "outside the pool"),
        ({"a": [1]}, {"a": 17}, "only 1 blocks"),
    ],
)
def test_snapshot_rejects_impossible_pools(tables, lengths, message):
    with pytest.raises(ValueError, match=message):
        snapshot_blocks(tables, num_blocks=8, block_size=16, lengths=lengths)


def test_block_map_grid_and_slider():
    snaps = [
        snapshot_blocks({"x": [0, 3]}, 64, lengths={"x": 20}, label="step 1"),
        snapshot_blocks({}, 64, label="step 2"),
    ]
    ax = plot_block_map(snaps[0])
    assert ax.get_title() == "step 1: 2/64 blocks used, 12 empty slots in them"
    assert len(plot_block_maps(snaps, per_row=2).axes) == 2
    slider = block_map_slider(snaps)
    assert slider.children[0].max == 1


def runs_at_rates():
    def trace(gap):
        records = [
            RequestRecord(str(i), float(i), 4, float(i), token_times=[i + gap, i + 2 * gap], finish_time=i + 2 * gap)
            for i in range(4)
        ]
        return Trace(records, [step(0, {"0": 1})])

    return {
        "static": {1.0: summarize(trace(0.5)), 2.0: summarize(trace(0.8))},
        "continuous": {1.0: summarize(trace(0.2)), 2.0: summarize(trace(0.3))},
    }


def test_latency_and_throughput_against_rate():
    ax = plot_latency_vs_rate(runs_at_rates(), metric="ttft", slo_ms=400)
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert lines["static p50"] == pytest.approx([500, 800])
    assert lines["continuous p99"] == pytest.approx([200, 300])
    assert "SLO 400 ms" in lines
    ax = plot_throughput_vs_rate(runs_at_rates())
    assert [line.get_label() for line in ax.get_lines()] == ["static", "continuous"]
    with pytest.raises(ValueError, match="unknown metric"):
        plot_latency_vs_rate(runs_at_rates(), metric="speed")


def test_token_gaps_show_a_stall(two_requests):
    two_requests.requests[1].token_times = [2.0, 4.5]
    ax = plot_token_gaps(two_requests, request_ids=["b"])
    assert list(ax.collections[0].get_offsets()[:, 1]) == [2500.0]


# The post's 24 GB card: 1 TB/s and 165 TFLOP/s, an 8B model in 16 bits (16 GB, 16 GFLOP per token).
CARD = Roofline(bandwidth=1e12, flops=165e12, weight_bytes=16e9, flops_per_token=16e9)


def test_roofline_bound_under_the_measured_points():
    figure = plot_roofline(CARD, [1, 8, 64], [60.0, 480.0, 3000.0], {"a prefill": (512, 9000.0)})
    bound, _, measured, prefill = figure.axes[0].get_lines()
    x, y = bound.get_xdata(), bound.get_ydata()
    assert y[0] == pytest.approx(62.5 * x[0]) and y.max() == pytest.approx(165e12 / 16e9)
    assert list(measured.get_ydata()) == [60.0, 480.0, 3000.0] and prefill.get_label() == "a prefill"


def test_roofline_bound_rises_with_the_batch_then_meets_the_roof_at_the_knee():
    roof = CARD
    assert roof.knee == pytest.approx(165)
    assert roof.bound(1) == pytest.approx(62.5)  # one stream: bandwidth / weight bytes
    assert roof.bound(100) == pytest.approx(100 * 62.5)
    assert roof.bound(1000) == pytest.approx(165e12 / 16e9)
    assert roof.side(1) == "bandwidth-bound" and roof.side(2000) == "arithmetic-bound"


def test_batch_spans_follow_each_batch_to_its_own_longest_member():
    assert batch_spans([10, 500], 2) == [(0, 10, 490), (0, 500, 0)]
    assert batch_spans([3, 1, 4], 2) == [(0, 3, 0), (0, 1, 2), (3, 4, 0)]


def test_svg_figures_keep_their_words_as_text_and_carry_no_date(tmp_path) -> None:
    """The book's figures: labels a reader can select and a test can measure; the same figure, the same bytes."""
    import io

    before = matplotlib.rcParams["svg.fonttype"]
    try:
        use_svg_figures()  # outside IPython: only the SVG settings change
        fig, ax = plt.subplots(figsize=(4, 2))
        ax.set_title("tokens per second", fontsize=9)
        drawn = []
        for _ in range(2):
            out = io.StringIO()
            fig.savefig(out, format="svg", metadata={"Date": None})
            drawn.append(out.getvalue())
        plt.close(fig)
    finally:
        matplotlib.rcParams["svg.fonttype"] = before
    assert ">tokens per second</text>" in drawn[0] and "font-size: 9px" in drawn[0]
    assert drawn[0] == drawn[1]


def test_as_shown_rounds_a_half_away_from_zero_as_the_page_does():
    """A chapter's table prints a number as its figure does: Python's round-half-even would print 312 where the
    page's fmt prints 313 (the MI355X's critical batch is 312.5 tokens)."""
    from labkit.viz.interactive import as_shown

    assert as_shown(312.5) == "313" != f"{312.5:.0f}"
    assert as_shown(1234.5) == "1,235"
    assert as_shown(-2.5) == "-3"
    assert as_shown(0.125, 2) == "0.13"
    assert as_shown(1.005, 2) == "1.01"  # its shortest decimal form, as a browser rounds it (the double is below)
