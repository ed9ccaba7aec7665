"""Guards against slow and hostile clients: bounded connections, read deadlines, a log that cannot flood.

Every connection holds a file descriptor, and a process may open only so many (``ulimit -n``,
often 256 or 1024 in a shell). So, as ``vllm serve`` does, the server first raises its soft
open-file limit to the hard one (:func:`raise_open_file_limit`), then keeps connections well
below it, and closes one that has not sent its request's headers within ``header_timeout`` seconds
(an idle or half-open one, or one trickling a byte at a time): :class:`GuardedH11Protocol` says how.
Uvicorn's own ``timeout_keep_alive`` closes connections idle between requests, and the app
gives a body the same deadline. Each client turned away is one warning line, not a traceback,
and :class:`RateLimited` lets through at most one line a second of each kind, counting the rest.
A client that half-closes once its request is sent is still answered (:meth:`GuardedH11Protocol.eof_received`),
and one that closed while its whole answer is computed is found gone by probing it (:meth:`GuardedH11Protocol._probe`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import time
from collections.abc import Awaitable, Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("uvicorn.error")  # where uvicorn's own warnings go, printed as WARNING:  ...
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)  # what asyncio's accept() logs
ALWAYS_OPEN = ("/health", "/metrics", "/kv_events")  # answered past the connection limit too
HEADROOM = 8  # connections past the limit, for ALWAYS_OPEN requests only
HEADROOM_HEADER_S = 2.0  # seconds such a connection has to send its request's headers
FD_RESERVE = 64  # descriptors kept free beyond those already open (model files, pipes, threads), never for clients
_SORRY = b"Too many connections; retry later.\n"
TOO_MANY = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nconnection: close\r\n"
TOO_MANY += b"content-length: %d\r\n\r\n%s" % (len(_SORRY), _SORRY)


def raise_open_file_limit(wanted: int = 65535) -> int:
    """Raise the soft open-file limit towards ``wanted``, never past the hard one (as vLLM); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as err:
            log.warning("could not raise the open-file limit from %d (%s); try ulimit -n %d", soft, err, target)
    return soft


def connection_limit(wanted: int) -> int:
    """At most ``wanted`` connections, leaving those open now, ``HEADROOM`` and ``FD_RESERVE`` under the open-file limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    in_use = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    return max(8, min(wanted, soft - in_use - FD_RESERVE - HEADROOM))


class RateLimited(logging.Filter):
    """At most one record a second for each message template; the next one says how many were dropped.

    A client-caused error (out of descriptors) loses its traceback: one line says what happened.
    """

    def __init__(self, every_s: float = 1.0):
        super().__init__()
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = str(record.msg)
        now = time.monotonic()
        if now - self._last.get(key, -self.every_s) < self.every_s:
            self._dropped[key] = self._dropped.get(key, 0) + 1
            return False
        self._last[key] = now
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, OSError) and error.errno in OUT_OF_RESOURCES:  # "Too many open files": one line
            record.msg, record.exc_info, record.exc_text = f"{record.getMessage()}: {error}", None, None
            record.args = ()
        dropped = self._dropped.pop(key, 0)
        if dropped:
            record.msg = f"{record.getMessage()} (and {dropped} more like it in the last {self.every_s:g} s)"
            record.args = ()
        return True


def install_log_limits() -> None:
    """Rate-limit uvicorn's and asyncio's loggers (once per process, however many servers it runs)."""
    for name in ("uvicorn.error", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimited) for f in logger.filters):
            logger.addFilter(RateLimited())


def always_open_only(app: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """``app`` for ``ALWAYS_OPEN`` paths only: any other request gets the 503 of a connection past the limit."""

    async def guarded(scope: dict, receive: Callable, send: Callable) -> None:
        if scope["path"] in ALWAYS_OPEN:
            return await app(scope, receive, send)
        log.warning(
            "Turned a request away: the connection limit is reached, and %s is not health, metrics or KV events",
            scope["path"],
        )
        headers = [(b"content-type", b"text/plain"), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": _SORRY})

    return guarded


class GuardedH11Protocol(H11Protocol):
    """Uvicorn's HTTP/1.1 protocol, with a cap on connections and a deadline for each request's headers.

    Past ``max_connections``, the oldest idle connection (one that has sent no request since it
    opened or since its last answer) is closed for the new one: a load balancer that finds the
    health check refused takes a healthy replica out, so idle sockets holding every connection
    must not make it look dead (nginx reuses idle keep-alive connections the same way). With none
    idle, a connection may still ask for an ``ALWAYS_OPEN`` path (so a balancer still sees a healthy
    replica, and a router what it holds): ``HEADROOM`` more connections are let in, each for one such
    request (anything else gets 503) with a short deadline for its headers (``HEADROOM_HEADER_S``);
    past those, a connection gets its 503 and is closed at once, before it can hold a descriptor for
    long (uvicorn's ``limit_concurrency`` would 503 health too).
    """

    header_timeout = 10.0  # seconds; the server sets it from its own option
    max_connections: int | None = None  # the server sets it; None: no limit
    probe_every = 0.25  # seconds between probes of a client that closed its side before its whole answer

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._prober: asyncio.TimerHandle | None = None
        self._opened_at = time.monotonic()
        limit = self.max_connections
        if limit is not None and len(self.connections) > limit:
            self._close_oldest_idle()
        self._past_limit = limit is not None and len(self.connections) > limit
        if limit is not None and len(self.connections) > limit + HEADROOM:
            log.warning("Turned a client away: %d connections open (the limit, and %d for health)", limit, HEADROOM)
            transport.write(TOO_MANY)
            transport.close()
            return
        if self._past_limit:
            self.app = always_open_only(self.app)
        self._arm_header_deadline()

    def _close_oldest_idle(self) -> None:
        """Close the connection open longest with no request on it, if there is one (it frees a place)."""
        idle = [
            other
            for other in self.connections
            if other is not self
            and isinstance(other, GuardedH11Protocol)
            and not other.transport.is_closing()
            and other.conn.their_state is h11.IDLE
            and (other.cycle is None or other.cycle.response_complete)
        ]
        if idle:
            oldest = min(idle, key=lambda other: other._opened_at)
            oldest.transport.close()
            self.connections.discard(oldest)  # its connection_lost comes later; its place is free now

    def _arm_header_deadline(self) -> None:
        timeout = min(self.header_timeout, HEADROOM_HEADER_S) if self._past_limit else self.header_timeout
        self._header_deadline = self.loop.call_later(timeout, self._headers_too_slow, timeout)

    def _headers_too_slow(self, timeout: float) -> None:
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            log.warning("Closed a connection that sent no request within %g s", timeout)
            self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self._header_deadline is not None and self.conn.their_state is not h11.IDLE:
            self._header_deadline.cancel()  # the headers are in: the app's body deadline takes over
            self._header_deadline = None

    def on_response_complete(self) -> None:
        if self._past_limit:
            self.transport.close()  # one answer for a connection in the headroom, which it then frees
        super().on_response_complete()
        if self._header_deadline is None and not self.transport.is_closing():
            self._arm_header_deadline()  # the next request on this connection gets the same deadline

    def eof_received(self) -> bool | None:  # type: ignore[override]
        """The client half-closed (``shutdown(SHUT_WR)``) or closed: keep writing if its request is complete.

        Uvicorn closes the transport at EOF, so a client that half-closes after a whole request gets
        no answer (and its request is aborted). TCP cannot tell that from a full close until the
        server writes: so once the request is in, it is answered (and the connection then closed), and
        a client that really left is noticed at the next write (for a stream, the next token; for a
        whole answer, the next probe: :meth:`_probe`). An EOF before the request is complete is still
        a hang-up.
        """
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and self.conn.their_state is h11.DONE:
            cycle.keep_alive = False  # nothing more can come on this connection: close it after the answer
            self._probe()
            return True
        return None

    def _probe(self) -> None:
        """Until the answer starts, write an interim ``100 Continue`` every ``probe_every`` seconds.

        A non-streamed answer writes nothing until it is done, so a client gone after its request
        would keep its request running to the end. A client that closed answers the first probe with
        a reset, so the next write fails: the connection is lost, and the app aborts the request (as
        vLLM does once its connection is gone). One that only half-closed skips the probes, as every
        HTTP/1.1 client must skip a 1xx before the answer (an HTTP/1.0 one may not be sent any, so it
        is not probed). A streamed answer has started: its tokens probe.
        """
        cycle = self.cycle
        if cycle is None or cycle.response_started or self.transport.is_closing():
            return
        if self.conn.their_http_version != b"1.1":
            return
        self.transport.write(self.conn.send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")))
        self._prober = self.loop.call_later(self.probe_every, self._probe)

    def connection_lost(self, exc) -> None:
        for timer in (self._header_deadline, self._prober):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)
