"""A uvicorn server on a bound socket, in the foreground or on a thread of its own: what ``labkit serve`` and
``labkit route`` share (without the engine, so the router starts without loading torch)."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable

import uvicorn


class ReadyServer(uvicorn.Server):
    """Uvicorn's server, calling ``on_ready`` once its socket accepts connections."""

    on_ready: Callable[[], None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_ready is not None:
            self.on_ready()


def bound_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (0: a free port), or an OSError that names the port and the fix."""
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
    return sock


def url_of(sock: socket.socket) -> str:
    """The address a bound socket serves."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve_forever(server: ReadyServer, sock: socket.socket, ready: str) -> None:
    """Serve in the foreground until Ctrl-C or SIGTERM; ``ready`` goes to stderr once connections are accepted."""
    server.on_ready = lambda: print(ready, file=sys.stderr, flush=True)
    try:
        server.run(sockets=[sock])  # after a graceful stop, uvicorn raises the signal that stopped it again
    except KeyboardInterrupt:
        pass


class UvicornThread:
    """A server on a background thread, for tests and notebooks: ``with Thread(...) as s:`` serves at ``s.url``
    and stops on the way out, however the block ends. Subclasses build the server and call :meth:`_serve_on`."""

    what = "the server"  # for the error when it does not start

    def _serve_on(self, server: uvicorn.Server, sock: socket.socket, name: str) -> None:
        self.server, self.socket, self.url = server, sock, url_of(sock)
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=name, daemon=True)

    def start(self, timeout: float = 30.0):
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self.what} at {self.url} did not start within {timeout:g} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self.socket.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
