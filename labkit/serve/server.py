"""A server over an engine: uvicorn running the app, in the foreground (``labkit serve``) or in a thread.

The socket is bound here, before uvicorn starts, so port 0 (any free port) works and the
caller knows the address at once; the "serving on URL" line waits until it accepts
connections. Ctrl-C or SIGTERM drains the server (:meth:`Server.drain`): new requests get 503
and ``/health`` says so (code ``server_shutting_down``: a router stops sending it requests), requests
in flight get the drain limit to finish, and each one left then ends with an error its client can
read (an error event and ``[DONE]`` in a stream, a 503 otherwise) that names the limit, before uvicorn
closes the connections and the engine loop stops. The limit is ``shutdown_timeout`` seconds if given;
by default it is long enough for a :data:`DRAIN_TOKENS`-token answer at the speed the server measured
(the median time between two tokens of a request lately, times :data:`DRAIN_MARGIN`), and never below
:data:`DRAIN_FLOOR_S` (vLLM's shutdown takes such a timeout too).
Connections are bounded (see :mod:`~labkit.serve.guard`).
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import TYPE_CHECKING

import uvicorn

from labkit.serve import guard
from labkit.serve.admission import AdmissionHook
from labkit.serve.app import build_app
from labkit.serve.prometheus import ServerMetrics
from labkit.serve.protocol import APIError
from labkit.serve.uvicorn_thread import ReadyServer, UvicornThread, bound_socket
from labkit.serve.worker import EngineWorker

if TYPE_CHECKING:  # the engine loads torch; the server is handed one
    from labkit.engine.llm import LLM

DRAIN_TOKENS = 512  # the default drain limit lets an answer this long finish at the measured speed ...
DRAIN_MARGIN = 1.5  # ... with this much to spare (it may have been queued, or the batch may grow) ...
DRAIN_FLOOR_S = 10.0  # ... and never less than this (before anything is measured, this)
LAST_WORDS_S = 0.5  # after the grace period, how long the cut requests' handlers get to send their error


class Server(ReadyServer):
    """Uvicorn's server, saying when it is ready and draining before it stops."""

    def __init__(self, config: uvicorn.Config, worker: EngineWorker, shutdown_timeout: float | None):
        super().__init__(config)
        self.worker = worker
        self.shutdown_timeout = shutdown_timeout

    async def main_loop(self) -> None:
        await super().main_loop()  # until Ctrl-C, SIGTERM or ``should_exit``
        await self.drain()

    def drain_limit_s(self) -> float:
        """Seconds requests in flight get to finish once the server drains (see the module's doc)."""
        if self.shutdown_timeout is not None:
            return self.shutdown_timeout
        per_token = self.worker.seconds_per_token()
        return max(DRAIN_FLOOR_S, DRAIN_TOKENS * per_token * DRAIN_MARGIN if per_token is not None else 0.0)

    async def drain(self) -> None:
        """Refuse new requests; give those in flight the drain limit; then end the rest with an error."""
        self.worker.draining = True
        started = time.monotonic()
        while self.server_state.tasks and time.monotonic() - started < self.drain_limit_s() and not self.force_exit:
            await asyncio.sleep(0.05)
        if self.server_state.tasks:
            limit = self.drain_limit_s()
            how = "--shutdown-timeout" if self.shutdown_timeout is not None else f"{DRAIN_TOKENS} tokens' time"
            self.worker.end_all(
                APIError(
                    503,
                    f"The server shut down before this answer was complete: it gives requests in flight "
                    f"{limit:.3g} s to finish ({how}), and this one took longer; send it again once it is back.",
                    type="service_unavailable",
                    code="server_shutting_down",
                )
            )
            deadline = time.monotonic() + LAST_WORDS_S
            while self.server_state.tasks and time.monotonic() < deadline:
                await asyncio.sleep(0.02)


def make_server(
    llm: LLM,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    api_key: str | None = None,
    max_waiting: int | None = None,
    admission: AdmissionHook | None = None,
    served_model_name: str | None = None,
    shutdown_timeout: float | None = None,
    max_connections: int = 1000,
    read_timeout: float = 10.0,
) -> tuple[Server, socket.socket, EngineWorker]:
    """A uvicorn server for ``llm`` bound to ``host:port`` (not started), its socket and its engine worker.

    ``admission``, if given, is asked about every request before it is accepted (see
    :mod:`~labkit.serve.admission`). At most ``max_connections`` connections are open at once
    (fewer if the open-file limit is low), and ``guard.HEADROOM`` more for health and metrics only;
    a client has ``read_timeout`` seconds to send its request's headers, and as many for its body.
    """
    guard.raise_open_file_limit()
    guard.install_log_limits()
    name = served_model_name or llm.describe()["model"]
    metrics = ServerMetrics(
        name, speculative=llm.config.speculative_config is not None, max_model_len=llm.state.max_model_len
    )
    if llm.kv_tier is not None:
        metrics.watch_tier(llm.kv_tier, llm.config.block_size)
    worker = EngineWorker(llm, metrics, max_waiting, admission)
    app = build_app(worker, name, api_key, read_timeout)
    limit = guard.connection_limit(max_connections)
    protocol = type("Guarded", (guard.GuardedH11Protocol,), {"header_timeout": read_timeout, "max_connections": limit})
    config = uvicorn.Config(
        app,
        http=protocol,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_keep_alive=5,  # uvicorn's and vLLM's: an idle keep-alive connection is closed after 5 s
        # uvicorn annotates this as an int, but hands it to asyncio.timeout, which takes any seconds:
        # a backstop only, since the drain has ended every request by then
        timeout_graceful_shutdown=LAST_WORDS_S,  # type: ignore[arg-type]
    )
    sock = bound_socket(host, port)
    return Server(config, worker, shutdown_timeout), sock, worker


class ServerThread(UvicornThread):
    """``labkit serve`` in a background thread, for tests and notebooks.

    ``with ServerThread(llm) as server:`` starts it on a free loopback port (``server.url``)
    and stops it on the way out, however the block ends. ``options`` are :func:`make_server`'s
    (``api_key``, ``max_waiting``, ``admission``, ...).
    """

    def __init__(self, llm: LLM, host: str = "127.0.0.1", port: int = 0, **options):
        server, sock, self.worker = make_server(llm, host, port, **options)
        self._serve_on(server, sock, "labkit-serve")
