"""One replica's answer on its way to the client through ``labkit route``: relayed as it comes, closed once.

A stream goes on chunk by chunk as the replica sends it (the client sees each token's event when the replica
sends it, not when the answer is done); a whole answer at once. If the replica dies mid-answer the client is
told (an error event and ``[DONE]``, or a 502), and the request is not sent elsewhere: it was already being
answered. However the relay ends (done, failed, the client gone), the replica's response is closed, which tells
the replica to abort what is left, and the request stops counting as in flight there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import httpx
from starlette.responses import Response, StreamingResponse

from labkit.serve.protocol import APIError, sse_event

if TYPE_CHECKING:
    from labkit.serve.router_app import Routing

REPLICA_HEADER = "x-labkit-replica"  # on every forwarded answer: which replica served it (its URL)
PREDICTED_HEADER = "x-labkit-predicted-cached-tokens"  # with cache_aware: prompt tokens predicted cached there ...
CACHE_VIEW_HEADER = "x-labkit-cache-view"  # ... and from what: the replica's KV events or the shadow index


class Relay:
    """One replica's answer on its way to the client; :meth:`close` (once, however the relay ends) closes the
    replica's response and stops counting the request in flight there."""

    def __init__(self, routing: Routing, replica: int, upstream: httpx.Response):
        self.routing, self.replica, self.upstream = routing, replica, upstream
        self.url = routing.urls[replica]
        self.closed = False

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.routing.leave(self.replica)
            await self.upstream.aclose()

    def failed(self) -> None:
        """The replica died mid-answer: count it, and take the replica out of service."""
        self.routing.metrics.errors.labels("replica_failed_mid_answer").inc()
        self.routing.replicas.eject(self.replica, "failed mid-answer")

    async def read_refusal(self) -> str:
        """The start of a 5xx answer's body (what the replica said), and the relay closed."""
        try:
            return (await self.upstream.aread()).decode(errors="replace")[:300]
        except httpx.TransportError as err:
            return f"(its body was cut: {type(err).__name__})"
        finally:
            await self.close()

    async def response(self, extra_headers: dict[str, str]) -> Response:
        """The replica's answer, passed on (with ``extra_headers``): a stream chunk by chunk as it arrives, a whole
        answer at once."""
        headers = {REPLICA_HEADER: self.url, **extra_headers}
        if "retry-after" in self.upstream.headers:
            headers["retry-after"] = self.upstream.headers["retry-after"]
        media_type = self.upstream.headers.get("content-type", "application/json")
        status = self.upstream.status_code
        if media_type.startswith("text/event-stream"):
            return RelayedStream(self, self._chunks(), status, headers, media_type="text/event-stream")
        try:
            content = await self.upstream.aread()
        except httpx.TransportError as err:
            self.failed()
            raise APIError(
                502,
                f"The replica {self.url} failed while sending its answer ({type(err).__name__}); the request was "
                "not sent elsewhere, so that it is never served twice: send it again.",
                type="service_unavailable",
                code="replica_failed_mid_answer",
            ) from None
        finally:
            await self.close()
        return Response(content, status, headers, media_type=media_type)

    async def _chunks(self) -> AsyncIterator[bytes]:
        """The replica's server-sent events as they come; an error event and ``[DONE]`` if it dies mid-stream."""
        try:
            async for chunk in self.upstream.aiter_raw():
                yield chunk
        except httpx.TransportError as err:
            self.failed()
            error = APIError(
                502,
                f"The replica {self.url} failed mid-stream ({type(err).__name__}); the request was not sent "
                "elsewhere, so that it is never served twice.",
                type="service_unavailable",
                code="replica_failed_mid_answer",
            )
            yield (sse_event(error.body()) + "data: [DONE]\n\n").encode()
        finally:
            await self.close()


class RelayedStream(StreamingResponse):
    """A streamed answer that closes its relay however the response ends: a client that hangs up before the
    first chunk leaves a generator that never ran, whose ``finally`` would not."""

    def __init__(self, relay: Relay, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.relay = relay

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.relay.close()
