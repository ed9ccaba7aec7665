"""The router on uvicorn: bound here (port 0 works, the address is known at once), in the foreground or a thread.

The same connection guards as ``labkit serve`` (:mod:`~labkit.serve.guard`). Stopping it closes its client to
the replicas; streams still relayed end with the connection, and the replicas abort those requests.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable

import uvicorn

from labkit.serve import guard
from labkit.serve.router_app import Routing, build_router_app


class RouterServer(uvicorn.Server):
    """Uvicorn's server, calling ``on_ready`` once its socket accepts connections."""

    on_ready: Callable[[], None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_ready is not None:
            self.on_ready()


def make_router_server(
    routing: Routing, host: str = "127.0.0.1", port: int = 8000, max_connections: int = 1000
) -> tuple[RouterServer, socket.socket]:
    """A uvicorn server for the router bound to ``host:port`` (not started), and its socket."""
    guard.raise_open_file_limit()
    guard.install_log_limits()
    protocol = type("Guarded", (guard.GuardedH11Protocol,), {"header_timeout": routing.read_timeout})
    config = uvicorn.Config(
        build_router_app(routing),
        http=protocol,
        log_level="warning",
        access_log=False,
        lifespan="on",
        limit_concurrency=guard.connection_limit(max_connections),
        timeout_keep_alive=5,
        timeout_graceful_shutdown=1,
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
    return RouterServer(config), sock


def url_of(sock: socket.socket) -> str:
    """The address a bound socket serves (as :func:`labkit.serve.server.url_of`, which would import the engine)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve_forever(server: RouterServer, sock: socket.socket, ready: str) -> None:
    """Serve in the foreground until Ctrl-C or SIGTERM; ``ready`` goes to stderr once connections are accepted."""
    server.on_ready = lambda: print(ready, file=sys.stderr, flush=True)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass


class RouterThread:
    """``labkit route`` in a background thread, for tests and notebooks: ``with RouterThread(routing) as router:``
    serves on a free loopback port (``router.url``) and stops on the way out."""

    def __init__(self, routing: Routing, host: str = "127.0.0.1", port: int = 0):
        self.routing = routing
        self.server, self.socket = make_router_server(routing, host, port)
        self.url = url_of(self.socket)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, name="labkit-route", daemon=True
        )

    def start(self, timeout: float = 30.0) -> RouterThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the router at {self.url} did not start within {timeout:g} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self.socket.close()

    def __enter__(self) -> RouterThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
