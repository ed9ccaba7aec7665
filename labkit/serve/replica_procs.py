"""``labkit serve`` replicas as child processes on loopback, for ``labkit route --start N``.

Each replica is its own process (its own engine, its own torch threads), on a free loopback port; they are
started together, waited for until ``/health`` answers 200, and stopped with SIGTERM (which drains each, as
Ctrl-C does) then killed if they outlive the grace period. A replica that exits while starting stops them all
with its last lines of output in the error.

Once they serve, :meth:`ReplicaProcesses.watch` (a thread of ``labkit route``) reaps a replica that exits (no
zombie stays) and starts it again on the same port, at most ``max_restarts`` times each; past that it says the
replica stays down. The router's health checks find it gone or back (:mod:`~labkit.serve.router_health`).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

import httpx

log = logging.getLogger("uvicorn.error")
DEFAULT_MAX_RESTARTS = 3


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (the OS's pick; a replica binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ReplicaProcesses:
    """``count`` ``labkit serve`` processes with ``serve_args`` (model and engine dials) passed through."""

    def __init__(self, count: int, serve_args: Sequence[str], start_timeout_s: float = 300.0):
        if count < 1:
            raise ValueError(f"--start must be 1 or more replicas, got {count}")
        bad = {"--host", "--port"} & {arg.split("=")[0] for arg in serve_args}
        if bad:
            raise ValueError(f"the router picks each replica's {' and '.join(sorted(bad))}; leave it out")
        self.count, self.serve_args, self.start_timeout_s = count, list(serve_args), start_timeout_s
        self.processes: list[subprocess.Popen] = []
        self.logs: list = []
        self.urls: list[str] = []
        self.ports: list[int] = []
        self.restarts: list[int] = []  # times each was started again after it exited
        self.given_up: set[int] = set()  # replicas that exited once more than allowed: left down
        self._lock = threading.Lock()  # watch (its thread) and stop replace and end processes

    def start(self) -> list[str]:
        """Start them all and wait until each is healthy; their URLs."""
        for _ in range(self.count):
            port = free_port()
            self.ports.append(port)
            self.urls.append(f"http://127.0.0.1:{port}")
            self.restarts.append(0)
            self.processes.append(self._spawn(port))
        try:
            for process, output, url in zip(self.processes, self.logs, self.urls, strict=True):
                self._wait_healthy(process, output, url)
        except BaseException:
            self.stop()
            raise
        return self.urls

    def _spawn(self, port: int) -> subprocess.Popen:
        """One ``labkit serve`` on ``port``, its output kept in a temporary file (read if it fails to start)."""
        output = tempfile.TemporaryFile()
        self.logs.append(output)
        command = [sys.executable, "-m", "labkit.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
        return subprocess.Popen([*command, *self.serve_args], stdout=output, stderr=subprocess.STDOUT, env=os.environ)

    def watch(self, stop: threading.Event, max_restarts: int = DEFAULT_MAX_RESTARTS, every_s: float = 0.5) -> None:
        """Until ``stop`` is set: reap each replica that exited and start it again, or say it stays down."""
        while not stop.wait(every_s):
            self.check_children(max_restarts, stop)

    def check_children(self, max_restarts: int = DEFAULT_MAX_RESTARTS, stop: threading.Event | None = None) -> None:
        """One pass of :meth:`watch`: reap each replica that exited, start it again or report it (none once ``stop``
        is set: the replicas are being stopped)."""
        with self._lock:
            if stop is not None and stop.is_set():
                return
            for i, process in enumerate(self.processes):
                if i in self.given_up or process.poll() is None:  # poll() reaps an exited child
                    continue
                if self.restarts[i] < max_restarts:
                    self.restarts[i] += 1
                    log.warning(
                        "labkit route: the replica %s exited with status %s; starting it again (%d of %d)",
                        self.urls[i],
                        process.returncode,
                        self.restarts[i],
                        max_restarts,
                    )
                    self.processes[i] = self._spawn(self.ports[i])
                else:
                    self.given_up.add(i)
                    log.warning(
                        "labkit route: the replica %s exited with status %s after %d restarts; it stays down "
                        "(the others serve on)",
                        self.urls[i],
                        process.returncode,
                        max_restarts,
                    )

    def _wait_healthy(self, process: subprocess.Popen, output, url: str) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                output.seek(0)
                tail = output.read().decode(errors="replace")[-1500:]
                raise OSError(f"the replica for {url} exited with status {process.returncode} while starting:\n{tail}")
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise OSError(f"the replica for {url} was not healthy within {self.start_timeout_s:g} s")

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM each (they drain), then kill whichever is still there after ``grace_s``."""
        with self._lock:
            for process in self.processes:
                if process.poll() is None:
                    process.terminate()
            deadline = time.monotonic() + grace_s
            for process in self.processes:
                try:
                    process.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            for output in self.logs:
                output.close()
