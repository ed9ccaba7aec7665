"""The ASGI app of ``labkit route``: the OpenAI endpoints of ``labkit serve``, each request forwarded to a replica.

A completion or chat request is read once; where the router knows the caches (cache_aware), it is tokenized
once with the fleet's tokenizer and its blocks looked up in what each replica holds
(:mod:`~labkit.serve.router_caches`: the replica's KV events, read just before the decision, or the shadow index).
The policy picks one of the replicas in service from what it sees of each (requests in flight at the router,
tokens cached). The request goes there as it came (same JSON, same ``Authorization``); the answer comes back as
it went, a stream event by event, with headers saying which replica served it, how many prompt tokens the router
predicted cached there and from what (``kv_events`` or ``shadow``); the replica's own count is its usage's
``prompt_tokens_details.cached_tokens``.

Only replicas in service are offered to the policy (:mod:`~labkit.serve.router_health` says when one is ejected
and readmitted).

Nothing is lost, nothing is served twice. A replica that refuses the connection, closes it before answering or
answers 5xx (a draining ``labkit serve`` answers 503) has sent no byte of an answer: the request goes on to the
next replica in service (each at most once; the least busy first), and if none takes it the client gets a 503
that names each replica and what it said. Once a replica has answered (its status line came back) the request is
committed to it: if it dies mid-answer the client gets an error (an error event then ``[DONE]`` in a stream, as
``labkit serve`` does, or a 502), never a second answer from another replica. A replica that is too slow to
answer (``timeout``) may still be working on it, so it is not retried either (504).

A client that leaves a stream is noticed at the next event; the router then closes its connection to the
replica, which aborts the request at its next event and frees its blocks. A non-streamed request whose client
leaves runs to its end: ``labkit serve`` answers a client that only half-closed (:mod:`~labkit.serve.guard`),
so nothing can tell one that left until an answer is written to it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from labkit.engine.interfaces import ReplicaView, RequestView, Router
from labkit.serve.body import ERROR_HANDLERS, read_json
from labkit.serve.protocol import CHAT, COMPLETION, APIError
from labkit.serve.router_caches import FleetCaches
from labkit.serve.router_health import HEALTH_TIMEOUT_S, ReplicaHealth, is_draining
from labkit.serve.router_policies import prompt_ids, prompt_text
from labkit.serve.router_prometheus import RouterMetrics, replica_families
from labkit.serve.router_relay import CACHE_VIEW_HEADER, PREDICTED_HEADER, Relay


@dataclass
class Routing:
    """What the routes share (``app.state.routing``): the replicas, the policy, what it knows of their caches (and
    the tokenizer that needs), the metrics, which replicas are in service."""

    urls: list[str]
    policy: Router
    caches: FleetCaches | None  # None: the policy reads no cache, so none is kept and nothing tokenized
    metrics: RouterMetrics
    timeout_s: float  # how long a replica may take to start answering (and between two chunks of a stream)
    read_timeout: float = 10.0  # seconds a client's request body has to arrive
    in_flight: list[int] = field(init=False)
    health: ReplicaHealth | None = None  # None: ejected at once, probed with the default backoff
    client: httpx.AsyncClient | None = None  # made when the app starts, on its event loop
    tokenizer: Any = None  # the fleet's model's tokenizer: needed, and only used, with caches

    def __post_init__(self) -> None:
        self.in_flight = [0] * len(self.urls)
        if self.health is None:
            self.health = ReplicaHealth(self.urls, self.metrics)
        if self.caches is not None and self.tokenizer is None:
            raise ValueError("a router that reads the replicas' caches needs the fleet's tokenizer to name blocks")

    @property
    def replicas(self) -> ReplicaHealth:
        assert self.health is not None, "made in __post_init__"
        return self.health

    def cached(self, replica: int, token_ids: list[int] | None) -> int:
        """Tokens of the prompt the replica holds, by what the router knows (0 where it knows nothing)."""
        return self.caches.cached(replica, token_ids) if self.caches and token_ids else 0

    def pick(self, request: RequestView) -> tuple[list[int], dict[int, int]]:
        """The replicas in service, the policy's pick first, then the others least busy first (who gets the
        request if the pick refuses), and the cached tokens each was shown. The policy sees only those in
        service, numbered 0 to n-1 among them."""
        live = self.replicas.live()
        if not live:
            return [], {}
        ids = list(request.prompt_token_ids) if request.prompt_token_ids is not None else None
        cached = {i: self.cached(i, ids) for i in live}
        views = [ReplicaView(n, self.in_flight[i], cached[i]) for n, i in enumerate(live)]
        chosen = self.policy.route(request, views)
        if not (isinstance(chosen, int) and 0 <= chosen < len(live)):
            raise ValueError(f"router {self.policy.name!r} chose replica {chosen!r}; choose 0 to {len(live) - 1}")
        first = live[chosen]
        rest = sorted((i for i in live if i != first), key=lambda i: (self.in_flight[i], i))
        return [first, *rest], cached

    async def view(self, body: dict, path: str) -> RequestView:
        """The request as the policy sees it: its text, and its tokens where the router knows the caches (then
        each replica's cache is brought up to date too, so the policy sees it as it is now)."""
        text = prompt_text(body)
        if self.caches is None:
            return RequestView("", text)
        kind = CHAT if path.endswith("chat/completions") else COMPLETION
        ids = await asyncio.to_thread(prompt_ids, body, kind, self.tokenizer)  # a long chat template takes time
        assert self.client is not None, "the app's lifespan opens the client"
        await self.caches.refresh(self.client, self.replicas.live())
        return RequestView("", text, None if ids is None else tuple(ids))

    def enter(self, replica: int) -> None:
        self.in_flight[replica] += 1
        self.metrics.in_flight(replica, self.in_flight[replica])

    def leave(self, replica: int) -> None:
        self.in_flight[replica] -= 1
        self.metrics.in_flight(replica, self.in_flight[replica])


def build_router_app(routing: Routing) -> Starlette:
    """The router's ASGI app; starting it opens its HTTP client to the replicas, stopping it closes that."""

    async def forward_chat(request: Request) -> Response:
        return await forward(request, "/v1/chat/completions")

    async def forward_completion(request: Request) -> Response:
        return await forward(request, "/v1/completions")

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", forward_chat, methods=["POST"]),
            Route("/v1/completions", forward_completion, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        exception_handlers=ERROR_HANDLERS,
        lifespan=_lifespan,
    )
    app.state.routing = routing
    return app


@asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    routing: Routing = app.state.routing
    timeout = httpx.Timeout(routing.timeout_s, connect=5.0)
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        routing.client = client
        watcher = asyncio.create_task(routing.replicas.watch(client))
        try:
            yield
        finally:
            watcher.cancel()


def _routing(request: Request) -> Routing:
    return request.app.state.routing


def _headers(request: Request) -> dict[str, str]:
    """The client's headers a replica needs: the API key (the replicas check it) and the body's type."""
    headers = {"content-type": "application/json"}
    if "authorization" in request.headers:
        headers["authorization"] = request.headers["authorization"]
    return headers


async def forward(request: Request, path: str) -> Response:
    """Send one completion or chat request to the replica the policy picks, or to the next that takes it (see the
    module's doc)."""
    routing = _routing(request)
    assert routing.client is not None, "the app's lifespan opens the client"
    body = await read_json(request, routing.read_timeout)
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_json")
    content = json.dumps(body).encode()
    view = await routing.view(body, path)
    failures: list[str] = []
    tried, cached = routing.pick(view)
    for replica in tried:
        url = routing.urls[replica]
        upstream = await _send(routing, replica, request, path, content, failures)
        if upstream is None:
            continue
        relay = Relay(routing, replica, upstream)
        if upstream.status_code >= 500:
            said = await relay.read_refusal()
            failures.append(f"{url} answered {upstream.status_code}: {said}")
            routing.metrics.retries.labels(url).inc()
            if is_draining(said.encode()):  # it is going down: no new request for it (an overload 503 is not)
                routing.replicas.eject(replica, "draining")
            continue
        # committed: this replica answers, whatever happens next
        routing.metrics.routed(replica, cached[replica])
        headers = {}
        if routing.caches is not None and view.prompt_token_ids is not None:
            headers = {PREDICTED_HEADER: str(cached[replica]), CACHE_VIEW_HEADER: routing.caches.source(replica)}
            if upstream.status_code < 400:
                routing.caches.record(replica, view.prompt_token_ids)
        return await relay.response(headers)
    routing.metrics.errors.labels("no_replica_available").inc()
    out = [f"{routing.urls[i]} {routing.replicas.state(i)}" for i in routing.replicas.ejected if i not in tried]
    raise APIError(
        503,
        f"No replica could take the request ({len(failures)} tried): " + "; ".join(failures + out),
        type="service_unavailable",
        code="no_replica_available",
    )


async def _send(
    routing: Routing, replica: int, request: Request, path: str, content: bytes, failures: list[str]
) -> httpx.Response | None:
    """Forward the request to one replica and return its answer once its status line is in; None, with the reason
    added to ``failures`` and the replica ejected, when it refused the connection or closed it before answering.
    A replica that takes too long to start answering is a 504: it may still be serving the request."""
    assert routing.client is not None
    url = routing.urls[replica]

    def refused(err: Exception, said: str, reason: str) -> None:
        routing.leave(replica)
        failures.append(f"{url} {said} ({type(err).__name__})")
        routing.metrics.retries.labels(url).inc()
        routing.replicas.eject(replica, reason)

    routing.enter(replica)
    try:
        sent = routing.client.build_request("POST", url + path, content=content, headers=_headers(request))
        return await routing.client.send(sent, stream=True)
    except (httpx.ConnectError, httpx.ConnectTimeout) as err:
        refused(err, "refused the connection", "refused a connection")
    except httpx.TimeoutException:
        routing.leave(replica)
        routing.metrics.errors.labels("replica_timeout").inc()
        raise APIError(
            504,
            f"The replica {url} did not start answering within {routing.timeout_s:g} s; the request was not "
            "sent elsewhere, since that replica may still be serving it.",
            type="service_unavailable",
            code="replica_timeout",
        ) from None
    except httpx.TransportError as err:  # it closed the connection before any status line: nothing answered
        refused(err, "closed the connection before answering", "closed a connection before answering")
    except BaseException:  # cancelled, or a bug: the replica is not left counted busy
        routing.leave(replica)
        raise
    return None  # it refused: the next replica is tried


async def models(request: Request) -> Response:
    """``GET /v1/models``: the first replica that answers says (they all serve the same model)."""
    routing = _routing(request)
    assert routing.client is not None
    failures = []
    for url in routing.urls:
        try:
            answer = await routing.client.get(url + "/v1/models", headers=_headers(request))
        except httpx.TransportError as err:
            failures.append(f"{url}: {type(err).__name__}")
            continue
        if answer.status_code < 500:
            return Response(answer.content, answer.status_code, media_type=answer.headers.get("content-type"))
        failures.append(f"{url}: {answer.status_code}")
    raise APIError(
        503, "No replica answered /v1/models: " + "; ".join(failures), type="service_unavailable", code="no_replica"
    )


async def health(request: Request) -> Response:
    """``GET /health``: 200 while at least one replica is healthy (each replica's state in the body), else 503.
    Each replica is asked now, and ejected or readmitted by its answer."""
    routing = _routing(request)
    assert routing.client is not None
    states = await asyncio.gather(*(routing.replicas.check(routing.client, i) for i in range(len(routing.urls))))
    replicas: dict[str, Any] = dict(zip(routing.urls, states, strict=True))
    if "ok" in states:
        return JSONResponse({"replicas": replicas})
    problem = "; ".join(f"{url} {state}" for url, state in replicas.items())
    return JSONResponse(APIError(503, f"No replica is healthy: {problem}").body(), 503)


async def _metrics_of(client: httpx.AsyncClient, url: str) -> str | None:
    """A replica's ``/metrics`` text, or None if it does not answer."""
    try:
        answer = await client.get(url + "/metrics", timeout=HEALTH_TIMEOUT_S)
    except httpx.TransportError:
        return None
    return answer.text if answer.status_code == 200 else None


async def metrics(request: Request) -> Response:
    """``GET /metrics``: the router's own, then what each replica says of its load and cache (Prometheus's text
    format; see :mod:`~labkit.serve.router_prometheus`)."""
    routing = _routing(request)
    assert routing.client is not None
    texts = await asyncio.gather(*(_metrics_of(routing.client, url) for url in routing.urls))
    scraped = {url: text for url, text in zip(routing.urls, texts, strict=True) if text is not None}
    body = routing.metrics.render() + replica_families(scraped).encode()
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
