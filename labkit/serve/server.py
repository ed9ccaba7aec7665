"""A server over an engine: uvicorn running the app, in the foreground (``labkit serve``) or in a thread.

The socket is bound here, before uvicorn starts, so port 0 (any free port) works and the
caller knows the address at once. Uvicorn handles Ctrl-C and SIGTERM in the foreground:
it stops accepting, lets requests in flight finish for up to ``shutdown_timeout`` seconds,
cancels the rest, and then the app's shutdown stops the engine loop, which aborts whatever
is left and frees its blocks.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from labkit.serve.admission import AdmissionHook
from labkit.serve.app import build_app
from labkit.serve.metrics import ServerMetrics
from labkit.serve.worker import EngineWorker


def make_server(
    llm,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    api_key: str | None = None,
    max_waiting: int | None = None,
    admission: AdmissionHook | None = None,
    served_model_name: str | None = None,
    shutdown_timeout: float = 10.0,
) -> tuple[uvicorn.Server, socket.socket, EngineWorker]:
    """A uvicorn server for ``llm`` bound to ``host:port`` (not started), its socket and its engine worker.

    ``admission``, if given, is asked about every request before it is accepted (see
    :mod:`~labkit.serve.admission`).
    """
    name = served_model_name or llm.describe()["model"]
    metrics = ServerMetrics(name, speculative=llm.config.speculative_config is not None)
    worker = EngineWorker(llm, metrics, max_waiting, admission)
    app = build_app(worker, name, api_key)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        # uvicorn annotates this as an int, but hands it to asyncio.timeout, which takes any seconds
        timeout_graceful_shutdown=shutdown_timeout,  # type: ignore[arg-type]
    )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise OSError(
            f"cannot listen on {host}:{port} ({err.strerror}); pick another --port or stop whatever holds it"
        ) from None
    return uvicorn.Server(config), sock, worker


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ServerThread:
    """``labkit serve`` in a background thread, for tests and notebooks.

    ``with ServerThread(llm) as server:`` starts it on a free loopback port (``server.url``)
    and stops it on the way out, however the block ends. ``options`` are :func:`make_server`'s
    (``api_key``, ``max_waiting``, ``admission``, ...).
    """

    def __init__(self, llm, host: str = "127.0.0.1", port: int = 0, **options):
        self.server, self.socket, self.worker = make_server(llm, host, port, **options)
        self.url = url_of(self.socket)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, name="labkit-serve", daemon=True
        )

    def start(self, timeout: float = 30.0) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server at {self.url} did not start within {timeout:g} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self.socket.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
