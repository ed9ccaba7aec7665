"""Guards against slow and hostile clients: bounded connections, read deadlines, a log that cannot flood.

Every connection holds a file descriptor, and a process may open only so many (``ulimit -n``,
often 256 or 1024 in a shell). So, as ``vllm serve`` does, the server first raises its soft
open-file limit to the hard one (:func:`raise_open_file_limit`), then keeps connections well
below it: past ``max_connections`` a new connection gets a 503 and is closed at once, and one
that has not sent its request's headers within ``header_timeout`` seconds (an idle or
half-open one, or one trickling a byte at a time) is closed (:class:`GuardedH11Protocol`).
Uvicorn's own ``timeout_keep_alive`` closes connections idle between requests, and the app
gives a body the same deadline. Each client turned away is one warning line, not a traceback,
and :class:`RateLimited` lets through at most one line a second of each kind, counting the rest.
A client that half-closes once its request is sent is still answered (:meth:`GuardedH11Protocol.eof_received`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("uvicorn.error")  # where uvicorn's own warnings go, printed as WARNING:  ...
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)  # what asyncio's accept() logs
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
    """At most ``wanted`` connections, leaving those open now and ``FD_RESERVE`` more under the open-file limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    in_use = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    return max(8, min(wanted, soft - in_use - FD_RESERVE))


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


class GuardedH11Protocol(H11Protocol):
    """Uvicorn's HTTP/1.1 protocol, with a cap on connections and a deadline for each request's headers.

    ``limit_concurrency`` (uvicorn's setting) answers 503 to a request on a connection past the
    limit; this also turns away the connection itself, before it can hold a descriptor for long.
    """

    header_timeout = 10.0  # seconds; the server sets it from its own option

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        if self.limit_concurrency is not None and len(self.connections) > self.limit_concurrency:
            log.warning("Turned a client away: %d connections open (the limit)", self.limit_concurrency)
            transport.write(TOO_MANY)
            transport.close()
            return
        self._arm_header_deadline()

    def _arm_header_deadline(self) -> None:
        self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _headers_too_slow(self) -> None:
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            log.warning("Closed a connection that sent no request within %g s", self.header_timeout)
            self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self._header_deadline is not None and self.conn.their_state is not h11.IDLE:
            self._header_deadline.cancel()  # the headers are in: the app's body deadline takes over
            self._header_deadline = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._header_deadline is None and not self.transport.is_closing():
            self._arm_header_deadline()  # the next request on this connection gets the same deadline

    def eof_received(self) -> bool | None:  # type: ignore[override]
        """The client half-closed (``shutdown(SHUT_WR)``) or closed: keep writing if its request is complete.

        Uvicorn closes the transport at EOF, so a client that half-closes after a whole request gets
        no answer (and its request is aborted). TCP cannot tell that from a full close until the
        server writes: so once the request is in, it is answered (and the connection then closed), and
        a client that really left is noticed at the next write (for a stream, the next token). An EOF
        before the request is complete is still a hang-up.
        """
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and self.conn.their_state is h11.DONE:
            cycle.keep_alive = False  # nothing more can come on this connection: close it after the answer
            return True
        return None

    def connection_lost(self, exc) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        super().connection_lost(exc)
