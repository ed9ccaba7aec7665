"""``labkit serve`` replicas as child processes on loopback, for ``labkit route --start N``.

Each replica is its own process (its own engine, its own torch threads), on a free loopback port; they are
started together, waited for until ``/health`` answers 200, and stopped with SIGTERM (which drains each, as
Ctrl-C does) then killed if they outlive the grace period. A replica that exits while starting stops them all
with its last lines of output in the error.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import httpx


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

    def start(self) -> list[str]:
        """Start them all and wait until each is healthy; their URLs."""
        for _ in range(self.count):
            port = free_port()
            log = tempfile.TemporaryFile()
            command = [sys.executable, "-m", "labkit.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
            self.processes.append(
                subprocess.Popen([*command, *self.serve_args], stdout=log, stderr=subprocess.STDOUT, env=os.environ)
            )
            self.logs.append(log)
            self.urls.append(f"http://127.0.0.1:{port}")
        try:
            for process, log, url in zip(self.processes, self.logs, self.urls, strict=True):
                self._wait_healthy(process, log, url)
        except BaseException:
            self.stop()
            raise
        return self.urls

    def _wait_healthy(self, process: subprocess.Popen, log, url: str) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-1500:]
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
        for log in self.logs:
            log.close()
