"""Which replicas ``labkit route`` may send a request to: ejected at the first sign of trouble, readmitted when healthy.

Envoy's outlier detection, in its simplest form. A replica is ejected at once when it refuses a connection,
closes one before answering, dies mid-answer, says it is draining (a 503 with code ``server_shutting_down``) or
fails a health check (its ``/health`` is not 200): no request tries it again until it is readmitted. An ejected
replica is probed in the background (``GET /health``), first after ``first_backoff_s`` and then after twice the
wait each time it still fails, up to ``max_backoff_s``; the first 200 readmits it. Live replicas are checked
every ``check_every_s`` too, so one that dies or starts draining while idle is ejected before a request finds it.
Each ejection and readmission is one log line and a count in ``/metrics``.

Why at once, not after a few failures as Envoy's default: a refused connection costs the client a retry on every
request that tries the dead replica, and a replica that is back is found within one probe anyway.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import httpx

from labkit.serve.router_prometheus import RouterMetrics

log = logging.getLogger("uvicorn.error")  # where the router's warnings print (WARNING:  ...), as uvicorn's do
HEALTH_TIMEOUT_S = 2.0
DRAINING = "server_shutting_down"  # the error code of a draining labkit serve's 503s


@dataclass
class Ejected:
    """Why a replica is out, and when it is probed next."""

    reason: str
    backoff_s: float
    next_probe: float  # time.monotonic()


class ReplicaHealth:
    """Which replicas are live; each ejected one with its reason and its next probe."""

    def __init__(
        self,
        urls: list[str],
        metrics: RouterMetrics,
        first_backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        check_every_s: float = 2.0,
    ):
        if not 0 < first_backoff_s <= max_backoff_s or check_every_s <= 0:
            raise ValueError(
                f"backoffs must satisfy 0 < first ({first_backoff_s}) <= max ({max_backoff_s}), and the check "
                f"interval ({check_every_s}) must be above 0"
            )
        self.urls, self.metrics = urls, metrics
        self.first_backoff_s, self.max_backoff_s, self.check_every_s = first_backoff_s, max_backoff_s, check_every_s
        self.ejected: dict[int, Ejected] = {}

    def live(self) -> list[int]:
        """The replicas a request may go to, in index order."""
        return [i for i in range(len(self.urls)) if i not in self.ejected]

    def state(self, replica: int) -> str:
        """``"ok"``, or why the replica is out."""
        out = self.ejected.get(replica)
        return "ok" if out is None else f"ejected: {out.reason}"

    def eject(self, replica: int, reason: str) -> None:
        """Take the replica out now (no-op if it is out already)."""
        if replica in self.ejected:
            return
        self.ejected[replica] = Ejected(reason, self.first_backoff_s, time.monotonic() + self.first_backoff_s)
        self.metrics.ejected(replica)
        log.warning("labkit route: ejected %s (%s); probing it until it is healthy", self.urls[replica], reason)

    def readmit(self, replica: int) -> None:
        if self.ejected.pop(replica, None) is not None:
            self.metrics.readmitted(replica)
            log.warning("labkit route: readmitted %s (its /health answers 200)", self.urls[replica])

    async def check(self, client: httpx.AsyncClient, replica: int) -> str:
        """Ask the replica's ``/health`` now and eject or readmit it by the answer: ``"ok"`` or why it is out."""
        problem = await _health_problem(client, self.urls[replica])
        if problem is None:
            self.readmit(replica)
            return "ok"
        out = self.ejected.get(replica)
        if out is None:
            self.eject(replica, problem)
        else:  # still failing: wait twice as long before the next probe
            out.reason = problem
            out.backoff_s = min(2 * out.backoff_s, self.max_backoff_s)
            out.next_probe = time.monotonic() + out.backoff_s
        return self.state(replica)

    async def watch(self, client: httpx.AsyncClient) -> None:
        """Forever: probe each ejected replica when its backoff is over, and check the live ones every
        ``check_every_s`` (the router's lifespan runs this as a task and cancels it on the way out)."""
        next_check = time.monotonic()
        while True:
            now = time.monotonic()
            due = [i for i, out in self.ejected.items() if out.next_probe <= now]
            if now >= next_check:
                due += self.live()
                next_check = now + self.check_every_s
            await asyncio.gather(*(self.check(client, i) for i in due))
            await asyncio.sleep(min(0.1, self.first_backoff_s))


async def _health_problem(client: httpx.AsyncClient, url: str) -> str | None:
    """None if the replica's ``/health`` answers 200, else what is wrong (draining, unreachable, its status)."""
    try:
        answer = await client.get(url + "/health", timeout=HEALTH_TIMEOUT_S)
    except httpx.TransportError as err:
        return f"unreachable ({type(err).__name__})"
    if answer.status_code == 200:
        return None
    return "draining" if is_draining(answer.content) else f"/health answered {answer.status_code}"


def is_draining(body: bytes) -> bool:
    """Whether a replica's error body says it is shutting down (labkit serve's code for it)."""
    return DRAINING.encode() in body
