"""The router on uvicorn: bound here (port 0 works, the address is known at once), in the foreground or a thread.

The same connection guards as ``labkit serve`` (:mod:`~labkit.serve.guard`). Stopping it closes its client to
the replicas; streams still relayed end with the connection, and the replicas abort those requests.
"""

from __future__ import annotations

import socket

import uvicorn

from labkit.serve import guard
from labkit.serve.router_app import Routing, build_router_app
from labkit.serve.uvicorn_thread import ReadyServer, UvicornThread, bound_socket


def make_router_server(
    routing: Routing, host: str = "127.0.0.1", port: int = 8000, max_connections: int = 1000
) -> tuple[ReadyServer, socket.socket]:
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
    sock = bound_socket(host, port)
    return ReadyServer(config), sock


class RouterThread(UvicornThread):
    """``labkit route`` in a background thread, for tests and notebooks: ``with RouterThread(routing) as router:``
    serves on a free loopback port (``router.url``) and stops on the way out."""

    what = "the router"

    def __init__(self, routing: Routing, host: str = "127.0.0.1", port: int = 0):
        self.routing = routing
        server, sock = make_router_server(routing, host, port)
        self._serve_on(server, sock, "labkit-route")
