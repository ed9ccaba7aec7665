"""A request's JSON body read with its limits, and errors answered in OpenAI's shape: what ``labkit serve``
and ``labkit route`` share, kept apart from the engine so the router starts without loading torch."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from labkit.serve.guard import log
from labkit.serve.protocol import APIError

MAX_BODY_BYTES = 4 * 2**20  # far above any prompt that fits a context window
DRAIN_BYTES = 64 * 2**20  # an oversized body is read (and dropped) up to this, so its client sees the 413


async def read_json(request: Request, timeout_s: float = 10.0) -> object:
    """The decoded body; 415 unless it says it is JSON, 413 past ``MAX_BODY_BYTES``, 400 if it is not JSON,
    408 if it takes over ``timeout_s`` to arrive."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise APIError(
            415,
            f"The request body must be sent as Content-Type: application/json, not {media_type or 'no type'}.",
            code="unsupported_media_type",
        )
    declared = request.headers.get("content-length", "")
    too_big = declared.isdigit() and int(declared) > MAX_BODY_BYTES
    body, size = bytearray(), 0
    try:
        async with asyncio.timeout(timeout_s):
            if not too_big or int(declared) <= DRAIN_BYTES:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size <= MAX_BODY_BYTES:
                        body += chunk
                    elif size > DRAIN_BYTES:
                        break
    except TimeoutError:
        log.warning("Answered 408 to a client whose request body took over %g s", timeout_s)
        raise APIError(
            408,
            f"The request body did not arrive within {timeout_s:g} s.",
            code="request_timeout",
            headers={"Connection": "close"},
        ) from None
    except ClientDisconnect:  # nobody is left to answer: one line in the log, no traceback
        log.warning("A client hung up before it had sent its request body")
        raise APIError(499, "The client hung up.") from None
    if too_big or size > MAX_BODY_BYTES:
        raise APIError(
            413,
            f"The request body is over {MAX_BODY_BYTES // 2**20} MiB; send a smaller one.",
            code="request_too_large",
        )
    try:
        return await asyncio.to_thread(json.loads, body)  # a 4 MiB body takes a while to decode
    except (ValueError, RecursionError) as err:  # RecursionError: absurdly deep nesting
        raise APIError(
            400, f"The request body is not valid JSON ({type(err).__name__}: {str(err)[:200]}).", code="invalid_json"
        ) from None


async def answer_api_error(request: Request, err: APIError) -> Response:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def answer_http_error(request: Request, err: HTTPException) -> Response:
    """Unknown paths and wrong methods, in the same error shape as everything else."""
    return JSONResponse(
        APIError(err.status_code, str(err.detail), type="invalid_request_error").body(),
        status_code=err.status_code,
        headers=err.headers,
    )


# Starlette types a handler as taking any Exception; each of these is called only with its own kind
ERROR_HANDLERS: dict[Any, Callable[..., Awaitable[Response]]] = {
    APIError: answer_api_error,
    HTTPException: answer_http_error,
}
