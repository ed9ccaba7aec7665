"""Watching a server's gauges while a load runs, and the plot they make.

A real server on loopback (the tiny model behind the default tokenizer, attention slowed a
little so requests stay in flight between scrapes) is scraped while a few concurrent requests
run. The live plot is tested with a stand-in for the notebook's display; outside a kernel
nothing may be drawn. Nothing asserts a duration.
"""

import asyncio
import sys
import threading
import time
import types

import httpx
import matplotlib
import pytest
from test_serve import chat_model, make_llm, slow_attention

from labkit.serve import watch as watching
from labkit.serve.server import ServerThread
from labkit.serve.watch import GaugeSample, read_gauges, watch
from labkit.viz import plot_server_gauges

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
NUM_REQUESTS, MAX_TOKENS = 4, 48


@pytest.fixture(scope="module")
def server():
    llm = make_llm(chat_model(), max_num_seqs=2, attention=slow_attention)
    with ServerThread(llm) as running:
        running.name = llm.describe()["model"]
        yield running


def load(server) -> list[int]:
    """A few concurrent completions (more than the batch seats, so some wait); their token counts."""

    async def all_of_them():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            body = {"model": server.name, "prompt": "Once upon a time", "max_tokens": MAX_TOKENS, "ignore_eos": True}
            answers = await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(NUM_REQUESTS)))
            return [answer.json()["usage"]["completion_tokens"] for answer in answers]

    return asyncio.run(all_of_them())


def test_watch_samples_the_gauges_while_the_work_runs_and_returns_its_result(server):
    result, samples = watch(server.url, lambda: load(server), every_s=0.05)
    assert result == [MAX_TOKENS] * NUM_REQUESTS
    assert len(samples) >= 3
    times = [sample.t_s for sample in samples]
    assert times == sorted(times) and len(set(times)) == len(times) and times[0] >= 0
    assert max(sample.running for sample in samples) > 0  # it saw the batch at work
    assert max(sample.running for sample in samples) <= 2  # never more than the seats
    assert all(0.0 <= sample.kv_usage <= 1.0 for sample in samples)
    assert max(sample.kv_usage for sample in samples) > 0


def test_the_works_exception_is_raised_in_the_caller(server):
    def broken():
        time.sleep(0.1)
        raise ValueError("the load generator broke")

    with pytest.raises(ValueError, match="the load generator broke"):
        watch(server.url, broken, every_s=0.05)


def test_read_gauges_names_what_is_missing():
    page = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3.0\n"
    with pytest.raises(ValueError, match="vllm:kv_cache_usage_perc, vllm:num_requests_waiting"):
        read_gauges(page)
    page += "vllm:num_requests_waiting 1.0\nvllm:kv_cache_usage_perc 0.25\n"
    assert read_gauges(page) == {"running": 3.0, "waiting": 1.0, "kv_usage": 0.25}


def test_outside_a_kernel_nothing_is_drawn(server, monkeypatch):
    monkeypatch.setattr(watching, "_LivePlot", None)  # would fail if called
    figures_before = plt.get_fignums()
    result, samples = watch(server.url, lambda: "done", every_s=0.05)
    assert result == "done" and samples
    assert plt.get_fignums() == figures_before


class FakeHandle:
    def __init__(self, shown):
        self.shown = shown

    def update(self, image):
        self.shown.append(image)


def test_in_a_kernel_the_plot_is_redrawn_in_place_at_most_once_a_second(server, monkeypatch):
    shown: list = []

    def display(image, display_id=False):
        assert display_id is True  # a handle to update in place, not a new output each time
        shown.append(image)
        return FakeHandle(shown)

    monkeypatch.setattr(watching, "_in_kernel", lambda: True)
    monkeypatch.setitem(sys.modules, "IPython.display", types.SimpleNamespace(display=display, Image=_Image))
    figures_before = plt.get_fignums()
    started = time.monotonic()
    watch(server.url, lambda: time.sleep(2.5), every_s=0.05)
    elapsed = time.monotonic() - started
    # the first display, a redraw per whole second at most, and the final one
    assert 2 <= len(shown) <= 2 + int(elapsed / watching.REDRAW_EVERY_S)
    assert all(image.data.startswith(b"\x89PNG") for image in shown)
    assert plt.get_fignums() == figures_before  # not a pyplot figure: the notebook will not show it twice


class _Image:
    def __init__(self, data, format):
        self.data, self.format = data, format


def test_watch_refuses_a_silly_interval(server):
    with pytest.raises(ValueError, match="positive"):
        watch(server.url, lambda: None, every_s=0)


# --- the plot ------------------------------------------------------------------------------------
SAMPLES = [
    GaugeSample(0.0, 0, 0, 0.0),
    GaugeSample(0.5, 2, 3, 0.4),
    GaugeSample(1.0, 2, 1, 0.8),
    GaugeSample(1.5, 1, 0, 0.3),
]


def test_plot_server_gauges_draws_requests_left_and_cache_percent_right():
    ax = plot_server_gauges(SAMPLES)
    try:
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert set(lines) == {"running", "waiting"}
        assert list(lines["running"].get_ydata()) == [0, 2, 2, 1]
        assert list(lines["waiting"].get_ydata()) == [0, 3, 1, 0]
        assert list(lines["running"].get_xdata()) == [0.0, 0.5, 1.0, 1.5]
        assert ax.get_ylabel() == "requests"
        [cache] = [other for other in ax.figure.axes if other is not ax]
        [usage] = cache.get_lines()
        assert usage.get_label() == "KV cache usage"
        assert list(usage.get_ydata()) == pytest.approx([0, 40, 80, 30])  # percent, not a 0..1 fraction
        assert cache.get_ylabel() == "KV cache usage (%)" and cache.get_ylim() == (0, 105)
        legend = [text.get_text() for text in ax.get_legend().get_texts()]
        assert legend == ["running", "waiting", "KV cache usage"]  # one legend for both axes
    finally:
        plt.close(ax.figure)


def test_plot_server_gauges_draws_on_a_given_axes_and_with_no_samples():
    figure, (left, right) = plt.subplots(1, 2)
    try:
        assert plot_server_gauges([], ax=right) is right
        assert len(right.get_lines()) == 2 and left.get_lines() == []
    finally:
        plt.close(figure)


def test_threads_end_with_watch(server):
    before = threading.active_count()
    watch(server.url, lambda: None, every_s=0.05)
    assert threading.active_count() <= before
