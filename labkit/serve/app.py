"""The HTTP routes of ``labkit serve``: OpenAI's completions API, models, health and metrics (starlette).

Each handler's docstring says what its route answers: the two completions routes (whole, or as server-sent
events: one per step's tokens, then ``data: [DONE]``), ``/v1/models``, ``/health``, ``/metrics``, ``/kv_events``
(which ``labkit route`` reads to know what this replica holds) and ``/reset_prefix_cache``. With an API key,
the ``/v1`` routes and the reset want ``Authorization: Bearer KEY`` (health, metrics and the events, which carry
block hashes and no tokens, stay open, as vLLM's health and metrics do). A body over ``MAX_BODY_BYTES`` is
refused with 413 before it is parsed, and one that is not ``Content-Type: application/json`` with 415, so a web
page the learner visits cannot make a local server generate (a browser sends a cross-site form or
``text/plain`` body without asking). A body has ``read_timeout`` seconds to arrive (else 408). Parsing and
tokenizing a request run off the event loop, so a huge prompt never stalls the other clients' streams. A client
found gone (the connection lost, or a write to it failing) has its request aborted, which frees its KV blocks
before the next step; one that only half-closed is answered (see :mod:`~labkit.serve.guard`). While the server
drains (see :mod:`~labkit.serve.server`), new requests get 503.
An :class:`Answer` dresses each reply (the echoed prompt, the logprobs); what the handlers share is a
:class:`Served` in ``app.state.served``.
"""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from labkit.engine.request import RequestOutput
from labkit.kv.kv_events import KVEventLog
from labkit.models.tokens import encode_prompt
from labkit.serve.body import ERROR_HANDLERS, read_json
from labkit.serve.logprobs import Logprobs
from labkit.serve.protocol import (
    CHAT,
    COMPLETION,
    APIError,
    CompletionRequest,
    Reply,
    model_list,
    parse_request,
    sse_event,
    usage,
)
from labkit.serve.text import TextStream
from labkit.serve.worker import EngineWorker, Handle, shutting_down


def build_app(
    worker: EngineWorker, model_name: str, api_key: str | None = None, read_timeout: float = 10.0
) -> Starlette:
    """The ASGI app over a (not yet started) worker; starting the app starts the engine loop."""
    tokenizer = worker.tokenizer
    if tokenizer is None:
        raise ValueError("labkit serve needs a model with a tokenizer (text in, text out); this one has none")
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", complete, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/kv_events", kv_events, methods=["GET"]),
            Route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"]),
        ],
        exception_handlers=ERROR_HANDLERS,
        lifespan=_lifespan,
    )
    app.state.served = Served(worker, model_name, tokenizer, api_key, read_timeout, int(time.time()))
    return app


@dataclass(frozen=True)
class Served:
    """What the routes share (``app.state.served``): the engine worker, the model and the server's settings."""

    worker: EngineWorker
    model_name: str
    tokenizer: Any  # never None: build_app refuses a model without one
    api_key: str | None
    read_timeout: float  # seconds a request body has to arrive
    created: int  # when the server started: the model's ``created`` in /v1/models

    def authorize(self, request: Request) -> None:
        """401 unless the request carries the API key (if the server has one)."""
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            raise APIError(
                401,
                "Incorrect or missing API key: send the header 'Authorization: Bearer <key>' "
                "with the key the server was started with.",
                type="authentication_error",
                code="invalid_api_key",
            )

    def prompt_ids(self, parsed: CompletionRequest) -> list[int]:
        """The prompt's token ids: given ones checked against the vocabulary, text or messages tokenized."""
        vocab_size = self.worker.vocab_size
        if isinstance(parsed.prompt, list) and isinstance(parsed.prompt[0], int):
            if max(parsed.prompt) >= vocab_size:
                raise APIError(
                    400,
                    f"prompt has token id {max(parsed.prompt)}, but the vocabulary has "
                    f"{vocab_size} (ids 0 to {vocab_size - 1}).",
                    param="prompt",
                )
            return list(parsed.prompt)
        try:
            return encode_prompt(self.tokenizer, parsed.prompt)
        except Exception as err:  # the chat template may refuse a conversation (say, two system messages)
            raise APIError(400, f"The prompt could not be tokenized: {err}", param="messages") from None

    def prepare(self, parsed: CompletionRequest) -> tuple[list[int], str]:
        """The prompt's token ids, and the text to echo before the answer ("" without ``echo``)."""
        ids = self.prompt_ids(parsed)
        if not parsed.echo:
            return ids, ""
        return ids, parsed.prompt if isinstance(parsed.prompt, str) else self.tokenizer.decode(ids)


def _served(request: Request) -> Served:
    return request.app.state.served


async def chat(request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    return await _completions(request, CHAT)


async def complete(request: Request) -> Response:
    """``POST /v1/completions``."""
    return await _completions(request, COMPLETION)


async def _completions(request: Request, kind: str) -> Response:
    """Check, tokenize and submit one request of ``kind``; answer whole, or stream it as server-sent events."""
    served = _served(request)
    worker, tokenizer, vocab_size = served.worker, served.tokenizer, served.worker.vocab_size
    if worker.draining:
        raise shutting_down()
    served.authorize(request)
    parsed = parse_request(await read_json(request, served.read_timeout), kind)
    if parsed.model not in (None, served.model_name):
        raise APIError(
            404,
            f"The model `{parsed.model}` does not exist; this server serves `{served.model_name}` (see GET /v1/models).",
            param="model",
            code="model_not_found",
        )
    ids, echo = await asyncio.to_thread(served.prepare, parsed)  # a long prompt's chat template and tokenizer take time
    params = parsed.sampling_params(len(ids), worker.context_limit)
    if parsed.logit_bias and max(parsed.logit_bias) >= vocab_size:
        raise APIError(
            400,
            f"logit_bias names token id {max(parsed.logit_bias)}, but the vocabulary has {vocab_size} "
            f"(ids 0 to {vocab_size - 1}).",
            param="logit_bias",
        )
    answer = Answer(
        params.stop_token_ids, echo, None if params.logprobs is None else Logprobs(tokenizer, kind, len(echo))
    )
    request_id = f"{'chatcmpl' if kind == CHAT else 'cmpl'}-{uuid.uuid4().hex}"  # vLLM's and OpenAI's ids
    handle = worker.submit(
        ids, params, TextStream(tokenizer, parsed.stop, parsed.stream, params.min_tokens), request_id
    )
    reply = Reply.new(handle.request_id, kind, served.model_name)
    watcher = asyncio.create_task(_close_on_disconnect(request, handle))
    if parsed.stream:
        return StreamingResponse(
            _events(handle, reply, answer, parsed.include_usage, watcher), media_type="text/event-stream"
        )
    try:
        return JSONResponse(await _whole(handle, reply, answer))
    finally:
        watcher.cancel()
        handle.close()


async def models(request: Request) -> Response:
    """``GET /v1/models``: the one model served."""
    served = _served(request)
    served.authorize(request)
    return JSONResponse(model_list(served.model_name, served.worker.context_limit, served.created))


async def health(request: Request) -> Response:
    """``GET /health``: 200 while the engine loop runs; 503 with the reason while draining or once it stopped."""
    worker = _served(request).worker
    if worker.draining:
        return JSONResponse(shutting_down().body(), 503)
    if worker.healthy:
        return Response(status_code=200)
    return JSONResponse(APIError(503, f"The engine is not running: {worker.error or 'stopped'}").body(), 503)


async def metrics(request: Request) -> Response:
    """``GET /metrics``: Prometheus's text format."""
    return Response(_served(request).worker.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


def _event_log(served: Served) -> KVEventLog:
    """The prefix cache's event log; 404 where this server has none (prefix caching off, or a pool without events)."""
    if served.worker.kv_events is None:
        raise APIError(
            404,
            "This server publishes no KV events: its prefix caching is off, or its block allocator has no "
            "publish_events. Start it with prefix caching on and labkit's allocator.",
            code="no_kv_events",
        )
    return served.worker.kv_events


async def kv_events(request: Request) -> Response:
    """``GET /kv_events?since=N&epoch=E``: the prefix cache's events after number ``N`` of log ``E``, or the hashes
    held now (see :meth:`~labkit.kv.kv_events.KVEventLog.read`)."""
    log = _event_log(_served(request))
    try:
        since = int(request.query_params.get("since", "0"))
    except ValueError:
        raise APIError(
            400, "since must be an event number (an integer): the last reply's next.", param="since"
        ) from None
    return JSONResponse(log.read(since, request.query_params.get("epoch")))


async def reset_prefix_cache(request: Request) -> Response:
    """``POST /reset_prefix_cache``: forget every cached block (published as ``AllBlocksCleared``); 409 while a
    request holds blocks."""
    served = _served(request)
    served.authorize(request)
    _event_log(served)
    if not await served.worker.reset_prefix_cache():
        raise APIError(409, "Requests hold blocks of the prefix cache; reset it once they are done.", code="busy")
    return Response(status_code=200)


@asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    worker = app.state.served.worker
    worker.start()
    yield
    await asyncio.to_thread(worker.stop)  # every request still in the engine is aborted, its blocks freed


async def _close_on_disconnect(request: Request, handle: Handle) -> None:
    """Wait for the client to hang up, then abort its request (its blocks are freed at the next step).

    For a whole answer too: uvicorn says ``http.disconnect`` once the connection is lost, which the
    guard's probes bring about for a client that closed before its answer (as vLLM polls for it)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    handle.close()


@dataclass
class Answer:
    """How one request's answer is dressed: what ends it, the echoed prompt, its logprobs' formatter."""

    stop_token_ids: tuple[int, ...]
    echo: str = ""  # the prompt's text, sent before the answer (completions with echo)
    logprobs: Logprobs | None = None  # None: the request asked for none

    def stop_reason(self, handle: Handle, output: RequestOutput) -> str | int | None:
        """vLLM's ``stop_reason``: the stop string or stop token id that ended the answer; None for EOS or length."""
        if output.finish_reason != "stop":
            return None
        if handle.text.stop_reason is not None:
            return handle.text.stop_reason
        last = output.token_ids[-1] if output.token_ids else None
        return last if last in self.stop_token_ids else None

    def logprobs_of(self, output: RequestOutput, start: int) -> dict | None:
        """The logprobs of the output's tokens from ``start`` on, in the kind's shape (None if not asked)."""
        if self.logprobs is None:
            return None
        return self.logprobs.format((output.logprobs or [])[start : len(output.token_ids)])


async def _whole(handle: Handle, reply: Reply, answer: Answer) -> dict:
    """A non-streamed answer: wait for the finished output (its text is decoded once, by the engine loop)."""
    pieces: list[str] = [answer.echo]
    async for output, piece in handle.outputs():
        pieces.append(piece)
    reason = output.finish_reason  # the last output is the finished one
    assert reason is not None, "a finished output has its reason"
    counts = usage(handle.prompt_len, len(output.token_ids), handle.cached_tokens)
    return reply.full(
        "".join(pieces), reason, counts, answer.stop_reason(handle, output), answer.logprobs_of(output, 0)
    )


async def _events(
    handle: Handle, reply: Reply, answer: Answer, include_usage: bool, watcher: asyncio.Task
) -> AsyncIterator[str]:
    """A streamed answer: one event per step's tokens (the last one carries the finish reason), usage, [DONE].

    The first event carries the echoed prompt, if any, before the first token's text."""
    num_tokens = 0
    try:
        async for output, piece in handle.outputs():
            reason = output.finish_reason if output.finished else None
            stop_reason = answer.stop_reason(handle, output) if output.finished else None
            first = num_tokens == 0
            text = answer.echo + piece if first else piece
            logprobs = answer.logprobs_of(output, num_tokens)
            chunk = reply.chunk(text, reason, first, include_usage, stop_reason, logprobs)
            yield sse_event(chunk)
            num_tokens = len(output.token_ids)
        if include_usage:
            yield sse_event(reply.usage_chunk(usage(handle.prompt_len, num_tokens, handle.cached_tokens)))
    except APIError as err:  # the stream has started, so the error goes in an event, as vLLM does
        yield sse_event(err.body())
    finally:
        watcher.cancel()
        handle.close()
    yield "data: [DONE]\n\n"
