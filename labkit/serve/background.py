"""``labkit serve`` as a child process, and load and scrapes against it, for notebooks (lab 9).

A notebook that starts a server must never leave it behind: :class:`ServeProcess` starts
``labkit serve`` on a free loopback port (``--port 0``), waits for the line that says where it
listens and for ``/health`` to answer 200, keeps reading its log so it never blocks on a full pipe, and stops it with SIGTERM
(then SIGKILL) on ``stop()``, at the end of a ``with`` block, or when the kernel exits.

Jupyter already runs an event loop, so :func:`measure` runs ``labkit loadtest``'s async load in
a thread of its own and hands back one plain dict per request.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import httpx

from labkit.serve.loadtest import api_base, run_load
from labkit.trace import Trace
from labkit.workloads import make_workload


class ServeProcess:
    """``labkit serve ARGS`` in a child process on 127.0.0.1 and a free port; ``url`` once it answers."""

    launcher: tuple[str, ...] = (sys.executable, "-m", "labkit.cli", "serve")  # the command that serves
    name = "labkit serve"  # for messages; another server started this way (a subclass) gives its own
    ready_line = r" on (http://\S+)/v1"  # the log line that says where it listens

    def __init__(self, *args: str, startup_timeout_s: float = 180.0):
        command = [*self.launcher, "--host", "127.0.0.1", "--port", "0", *args]
        self.process = subprocess.Popen(
            command, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        atexit.register(self.stop)
        self.log: list[str] = []
        lines: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._read_log, args=(lines,), daemon=True).start()
        deadline = time.monotonic() + startup_timeout_s
        self.url = self._wait_for_url(lines, deadline)
        self._wait_for_health(deadline)

    def _read_log(self, lines: queue.SimpleQueue) -> None:
        assert self.process.stderr is not None, "Popen(stderr=PIPE) gave it a pipe"
        for line in self.process.stderr:
            self.log.append(line.rstrip())
            lines.put(line)
        lines.put(None)

    def _wait_for_url(self, lines: queue.SimpleQueue, deadline: float) -> str:
        while True:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                line = None
            if line is not None:
                found = re.search(self.ready_line, line)
                if found:
                    return found.group(1)
                continue
            raise self._failed("did not say where it listens")

    def _wait_for_health(self, deadline: float) -> None:
        """Poll ``/health`` until it answers 200: the server takes requests from then on."""
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if not self.running or time.monotonic() > deadline:
                raise self._failed(f"at {self.url} never answered /health")
            time.sleep(0.05)

    def _failed(self, problem: str) -> RuntimeError:
        """Stop it, and say what went wrong with the last lines of its log."""
        self.stop()
        tail = "\n".join(self.log[-10:])
        return RuntimeError(f"{self.name} {problem} (exit code {self.process.poll()}):\n{tail}")

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (a graceful stop), then SIGKILL if it has not ended within ``timeout_s``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def scrape(url: str) -> str:
    """The server's ``/metrics`` page, as Prometheus text."""
    return httpx.get(url.rstrip("/") + "/metrics", timeout=30).text


def per_request(trace: Trace) -> list[dict]:
    """One dict per request as a user saw it: ``ok`` and TTFT, TPOT, end-to-end latency in ms (None if lost)."""
    rows: list[dict] = []
    for record in trace.requests:
        first, finish = record.first_token_time, record.finish_time  # None: no token yet, not finished
        if first is None or finish is None or record.finish_reason == "rejected":
            rows.append({"ok": False, "ttft_ms": None, "tpot_ms": None, "e2el_ms": None})
            continue
        tpot = (finish - first) / (record.output_len - 1) if record.output_len > 1 else 0.0
        rows.append(
            {
                "ok": True,
                "ttft_ms": (first - record.arrival_time) * 1000.0,
                "tpot_ms": tpot * 1000.0,
                "e2el_ms": (finish - record.arrival_time) * 1000.0,
            }
        )
    return rows


def load(url: str, rate: float, num_prompts: int = 8, input_len: int = 32, output_len: int = 16, seed: int = 0):
    """``labkit loadtest``'s load (random prompts, Poisson arrivals at ``rate``): the run's trace and errors."""
    workload = make_workload("random", num_prompts, rate, seed=seed, input_len=input_len, output_len=output_len)
    base = api_base(url)
    model = httpx.get(base + "/models", timeout=30).json()["data"][0]["id"]
    result: dict = {}

    def run() -> None:  # a thread with its own event loop: the notebook's loop is busy running the cell
        result["value"] = asyncio.run(run_load(base, workload, model, ignore_eos=True))

    thread = threading.Thread(target=run, name="labkit-load")
    thread.start()
    thread.join()
    if "value" not in result:
        raise RuntimeError(f"the load against {url} did not complete")
    return result["value"]


def measure(url: str, rate: float, **load_options) -> list[dict]:
    """Load the server at ``rate`` requests/s and return what each request's user saw (see :func:`per_request`)."""
    trace, _errors = load(url, rate, **load_options)
    return per_request(trace)
