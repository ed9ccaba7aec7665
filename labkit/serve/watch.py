"""Watch a server's gauges while a load runs: what a dashboard shows, scraped from ``/metrics``.

``result, samples = watch(url, lambda: measure(url, rate=4))`` runs the work in a thread and,
meanwhile, reads ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and
``vllm:kv_cache_usage_perc`` every ``every_s`` seconds, as Prometheus would scrape them. Inside
a Jupyter kernel the plot (:func:`labkit.viz.plot_server_gauges`) is shown and redrawn in place
while the work runs, at most once a second and a tenth of the time: drawing takes CPU from the server.
Outside a kernel nothing is drawn; the samples come back either way.
"""

from __future__ import annotations

import io
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")
GAUGES = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "kv_usage": "vllm:kv_cache_usage_perc",
}
REDRAW_EVERY_S = 1.0  # the fastest the live plot is redrawn
DRAWING_SHARE = 0.1  # and no faster than drawing (0.4 s of CPU on a small machine) takes a tenth of the time


@dataclass(frozen=True)
class GaugeSample:
    """One scrape of the server's gauges."""

    t_s: float  # seconds since watching began
    running: float  # vllm:num_requests_running
    waiting: float  # vllm:num_requests_waiting
    kv_usage: float  # vllm:kv_cache_usage_perc (0..1)


def read_gauges(text: str) -> dict[str, float]:
    """The three gauges of a ``/metrics`` page (summed over series), by :class:`GaugeSample`'s field names."""
    by_name = {name: field for field, name in GAUGES.items()}
    values = dict.fromkeys(GAUGES, 0.0)
    found = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in by_name:
                values[by_name[sample.name]] += sample.value
                found.add(sample.name)
    missing = sorted(set(by_name) - found)
    if missing:
        raise ValueError(f"/metrics has no {', '.join(missing)}: is this an LLM server with vLLM's metric names?")
    return values


def watch(url: str, work: Callable[[], T], every_s: float = 0.5, live: bool = True) -> tuple[T, list[GaugeSample]]:
    """Run work() in a thread while this thread scrapes url/metrics every every_s; return work's result and samples.

    If ``work`` raises, its exception is raised here once its thread has ended. A scrape that
    fails (the server busy past the timeout, or gone) is skipped with a warning; the last
    sample is taken after the work ends.
    """
    if not every_s > 0:
        raise ValueError(f"every_s must be a positive number of seconds, got {every_s}")
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = work()
        except BaseException as err:  # handed to the caller's thread below
            outcome["error"] = err

    thread = threading.Thread(target=run, name="labkit-watch-work", daemon=True)
    plot = _LivePlot() if live and _in_kernel() else None
    samples: list[GaugeSample] = []
    failures: list[str] = []
    started = time.monotonic()
    with httpx.Client(timeout=max(every_s, 5.0)) as client:
        thread.start()
        while thread.is_alive():
            tick = time.monotonic()
            _scrape(client, url, started, samples, failures)
            if plot is not None:
                plot.draw(samples)
            thread.join(max(every_s - (time.monotonic() - tick), 0.0))
        _scrape(client, url, started, samples, failures)  # the state the work left behind
    if plot is not None:
        plot.draw(samples, final=True)
    if failures:
        warnings.warn(f"{len(failures)} scrapes of {url}/metrics failed, the last with {failures[-1]}", stacklevel=2)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"], samples


def _scrape(client: httpx.Client, url: str, started: float, samples: list[GaugeSample], failures: list[str]) -> None:
    try:
        page = client.get(url.rstrip("/") + "/metrics")
        page.raise_for_status()
        gauges = read_gauges(page.text)
    except (httpx.HTTPError, ValueError) as err:
        failures.append(f"{type(err).__name__}: {err}")
        return
    samples.append(GaugeSample(time.monotonic() - started, **gauges))


def _in_kernel() -> bool:
    """True inside a Jupyter kernel (where a display can be updated in place), not in a terminal or a test."""
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    return shell is not None and getattr(shell, "kernel", None) is not None


class _LivePlot:
    """The gauge plot in one notebook output, replaced in place as samples come in (PNG, any backend)."""

    def __init__(self):
        from IPython.display import display
        from matplotlib.figure import Figure

        self.figure = Figure(figsize=(7, 3), layout="constrained")  # not pyplot's: no second copy at cell end
        self.handle = display(self._render([]), display_id=True)
        self.drawn_at, self.drawing_s = time.monotonic(), 0.0

    def draw(self, samples: list[GaugeSample], final: bool = False) -> None:
        """Redraw once the last drawing is old enough (REDRAW_EVERY_S, DRAWING_SHARE); the final one always."""
        began = time.monotonic()
        if final or began - self.drawn_at >= max(REDRAW_EVERY_S, self.drawing_s / DRAWING_SHARE):
            self.handle.update(self._render(samples))
            self.drawn_at = time.monotonic()
            self.drawing_s = self.drawn_at - began

    def _render(self, samples: list[GaugeSample]):
        from IPython.display import Image

        from labkit.viz.serving import plot_server_gauges

        self.figure.clear()
        plot_server_gauges(samples, ax=self.figure.subplots())
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=80)
        return Image(data=buffer.getvalue(), format="png")
