"""The OpenAI wire format: what a request may say, and the shapes of answers and errors.

Every request is checked here before it reaches the engine, so a bad one costs the server
nothing and its client gets a 4xx naming the field and the fix, in OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}`` (the ``openai`` client turns it into
``BadRequestError`` and friends). Fields the engine cannot honour are refused, never
silently ignored (:data:`NOT_DONE` lists them, each with why); fields that change nothing
here (``user``, ``metadata``...) pass. Honoured beyond the basics: ``logprobs`` /
``top_logprobs``, the presence, frequency and repetition penalties, ``logit_bias``, ``min_p``,
``min_tokens`` and, on completions, ``echo``. ``ignore_eos``, ``top_k``, ``min_p``,
``min_tokens``, ``repetition_penalty`` and ``stop_token_ids`` are vLLM's extensions, accepted
as vLLM accepts them, and so are its defaults where a client can tell: a completion without
``max_tokens`` gets 16 tokens, and a ``developer`` message is read as a system one.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, fields

from labkit.sampling_params import MAX_BIAS, MAX_LOGPROBS, SamplingParams

CHAT, COMPLETION = "chat", "completion"
ROLES = ("system", "user", "assistant", "developer")  # developer: OpenAI's newer name for system
COMPLETION_MAX_TOKENS = 16  # vLLM's and OpenAI's default for /v1/completions
MAX_STOP_STRINGS = 4  # as OpenAI
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes
MAX_LOGIT_BIAS = 1024  # tokens one request may bias (labkit's bound: each is applied at every step)


class APIError(Exception):
    """A request the server refuses, with its HTTP status and the OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type: str = "invalid_request_error",
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str | None, message: str) -> APIError:
    return APIError(400, message, param=param)


@dataclass(frozen=True)
class CompletionRequest:
    """A validated request to /v1/chat/completions (``kind`` chat) or /v1/completions."""

    kind: str
    model: str | None
    prompt: list[dict] | str | list[int]  # chat messages, text, or token ids
    max_tokens: int | None  # None: as many as the context leaves
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    stream: bool
    include_usage: bool
    logprobs: int | None = None  # alternatives per token (chat: top_logprobs when logprobs is true); None: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: dict[int, float] | None = None
    min_tokens: int = 0
    echo: bool = False  # completions: the prompt's text comes first in the answer

    def sampling_params(self, prompt_len: int, context_limit: int) -> SamplingParams:
        """The engine's params, once the prompt's length is known; 400 if prompt plus answer cannot fit.

        ``context_limit`` is the most tokens one sequence may reach: max_model_len, or less
        if the whole KV cache holds less.
        """
        if prompt_len >= context_limit:
            raise bad(
                "messages" if self.kind == CHAT else "prompt",
                f"This model's maximum context length is {context_limit} tokens, and your prompt has "
                f"{prompt_len}, which leaves no room for an answer; shorten the prompt.",
            )
        max_tokens = self.max_tokens if self.max_tokens is not None else context_limit - prompt_len
        if prompt_len + max_tokens > context_limit:
            raise bad(
                "max_tokens",
                f"This model's maximum context length is {context_limit} tokens. However, "
                f"you requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, "
                f"{max_tokens} in the completion); lower max_tokens or shorten the prompt.",
            )
        if self.min_tokens > max_tokens:
            raise bad("min_tokens", f"min_tokens ({self.min_tokens}) must not be above max_tokens ({max_tokens}).")
        # the request's sampling fields carry SamplingParams' own names (and meanings)
        same = {
            setting.name: getattr(self, setting.name)
            for setting in fields(SamplingParams)
            if hasattr(self, setting.name)
        }
        return SamplingParams(**{**same, "max_tokens": max_tokens})


def parse_request(body: object, kind: str) -> CompletionRequest:
    """Check a decoded JSON body field by field; raise :class:`APIError` (400) at the first problem."""
    if not isinstance(body, dict):
        raise bad(None, "The request body must be a JSON object.")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", "model must be a string: the id that GET /v1/models lists.")
    refuse_what_is_not_done(body, kind)
    _check_n(body)
    stream, include_usage = _streaming(body)
    max_tokens = _max_tokens(body, kind)
    temperature, top_p, top_k, seed = _sampling(body)
    prompt = _messages(body) if kind == CHAT else _prompt(body)
    logprobs = _logprobs(body, kind)
    echo = _echo(body, kind, logprobs)
    repetition_penalty = _number(body, "repetition_penalty", 1.0, 0.0, 100.0)
    if repetition_penalty == 0:
        raise bad("repetition_penalty", "repetition_penalty must be greater than 0 (1 is off).")
    min_tokens = _optional(body, "min_tokens", int) or 0
    if min_tokens < 0:
        raise bad("min_tokens", f"min_tokens must be at least 0, got {min_tokens}.")
    return CompletionRequest(
        kind,
        model,
        prompt,
        max_tokens,
        temperature,
        top_p,
        max(top_k or 0, 0),
        seed,
        _stop(body),
        _stop_token_ids(body),
        bool(_optional(body, "ignore_eos", bool)),
        stream,
        include_usage,
        logprobs=logprobs,
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=repetition_penalty,
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        logit_bias=_logit_bias(body),
        min_tokens=min_tokens,
        echo=echo,
    )


def _check_n(body: dict) -> None:
    """One choice per request: ``n`` may be left out or 1."""
    n = _optional(body, "n", int)
    if n is not None and n < 1:
        raise bad("n", f"n must be at least 1 (the number of choices to return), got {n}.")
    if n not in (None, 1):
        raise bad("n", "n > 1 is not supported: labkit's server returns one choice; send n requests instead.")


def _streaming(body: dict) -> tuple[bool, bool]:
    """``stream``, and whether its last chunk carries the usage (``stream_options.include_usage``)."""
    stream = bool(_optional(body, "stream", bool))
    options = _optional(body, "stream_options", dict)
    if options is not None and not stream:
        raise bad("stream_options", "stream_options is only allowed when stream is true.")
    return stream, bool(_optional(options or {}, "include_usage", bool, "stream_options.include_usage"))


def _max_tokens(body: dict, kind: str) -> int | None:
    """The answer's length limit: chat's ``max_completion_tokens``, else ``max_tokens``, else a completion's
    default; None lets a chat answer run to the context's end."""
    max_tokens = _optional(body, "max_completion_tokens", int) if kind == CHAT else None
    if max_tokens is None:
        max_tokens = _optional(body, "max_tokens", int)
    if max_tokens is None and kind == COMPLETION:
        max_tokens = COMPLETION_MAX_TOKENS
    if max_tokens is not None and max_tokens < 1:
        raise bad("max_tokens", f"max_tokens must be at least 1, got {max_tokens}.")
    return max_tokens


def _sampling(body: dict) -> tuple[float, float, int | None, int | None]:
    """``temperature``, ``top_p``, ``top_k`` and ``seed``, each within its range."""
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise bad("top_p", "top_p must be greater than 0 (1 keeps every token).")
    top_k = _optional(body, "top_k", int)
    if top_k is not None and top_k < -1:
        raise bad("top_k", f"top_k must be -1 or 0 (off) or a positive number, got {top_k}.")
    seed = _optional(body, "seed", int)
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise bad("seed", f"seed must be an integer from {SEED_RANGE[0]} to {SEED_RANGE[1]}.")
    return temperature, top_p, top_k, seed


def _echo(body: dict, kind: str, logprobs: int | None) -> bool:
    """``echo``: a completion's prompt repeated before its answer, never with logprobs."""
    echo = bool(_optional(body, "echo", bool))
    if echo and kind == CHAT:
        raise bad(
            "echo", "echo is not supported on chat completions: labkit echoes the prompt on /v1/completions only."
        )
    if echo and logprobs is not None:
        raise bad(
            "echo",
            "echo with logprobs is not supported: labkit's engine computes logits only where it samples a token "
            "(and prefix caching skips the cached prompt), so it has no logprobs for the prompt's tokens. "
            "Ask for echo or for logprobs, not both.",
        )
    return echo


# Fields labkit's engine does not do: (does the body ask for it?, why not, what to do instead).
# A field set to its "off" value (tools [], tool_choice "none", best_of 1) asks for nothing.
NOT_DONE: dict[str, tuple] = {
    "tools": (
        lambda v: v not in (None, []),
        "labkit's server does not call tools (the course model has no tool format)",
    ),
    "tool_choice": (lambda v: v not in (None, "none", "auto"), "labkit's server does not call tools"),
    "functions": (lambda v: v not in (None, []), "labkit's server does not call functions"),
    "response_format": (
        lambda v: v is not None and v != {"type": "text"},
        "labkit's server does not constrain output to JSON or a schema (no guided decoding)",
    ),
    "best_of": (
        lambda v: v not in (None, 1),
        "labkit's engine returns one choice and keeps no candidates to rank (no best_of, no beam search)",
    ),
    "use_beam_search": (
        lambda v: v not in (None, False),
        "labkit's engine has no beam search (each request samples one sequence, token by token)",
    ),
    "suffix": (lambda v: v not in (None, ""), "labkit's engine does not fill in the middle"),
}


def refuse_what_is_not_done(body: dict, kind: str) -> None:
    """400 for the first field the body asks for that labkit cannot honour, naming it and why."""
    for name, (asks, why) in NOT_DONE.items():
        try:
            asked = asks(body.get(name))
        except TypeError:  # an unhashable value where a plain one is expected: it asks for something
            asked = True
        if asked:
            raise bad(name, f"{name} is not supported: {why}. Remove the field (or set it to its default).")


def _optional(body: dict, name: str, kind: type, param: str | None = None):
    """``body[name]`` if present and not null, checked to be of ``kind`` (a bool is not an int here)."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise bad(param or name, f"{param or name} must be {_KIND_NAMES[kind]}, got {json_type(value)}.")
    return value


_KIND_NAMES = {int: "an integer", bool: "true or false", dict: "an object", str: "a string", list: "an array"}


def json_type(value: object) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise bad(name, f"{name} must be a number from {low:g} to {high:g}, got {value!r}.")
    return float(value)


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP_STRINGS:
        raise bad("stop", f"stop must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them.")
    return tuple(stops)


def _stop_token_ids(body: dict) -> tuple[int, ...]:
    ids = body.get("stop_token_ids")
    if ids is None:
        return ()
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise bad("stop_token_ids", "stop_token_ids must be an array of token ids (integers >= 0).")
    return tuple(ids)


def _logprobs(body: dict, kind: str) -> int | None:
    """How many alternatives per token to return (0: the chosen token's logprob only), or None for none.

    Chat says ``logprobs: true`` and ``top_logprobs: N``; completions say ``logprobs: N``.
    """
    if kind == CHAT:
        asked = _optional(body, "logprobs", bool)
        top = _optional(body, "top_logprobs", int)
        if top is not None and not 0 <= top <= MAX_LOGPROBS:
            raise bad("top_logprobs", f"top_logprobs must be an integer from 0 to {MAX_LOGPROBS}, got {top}.")
        if top and not asked:
            raise bad("top_logprobs", "top_logprobs needs logprobs: true as well.")
        return (top or 0) if asked else None
    if body.get("top_logprobs") is not None:
        raise bad("top_logprobs", "top_logprobs is a chat field; on /v1/completions send logprobs: N instead.")
    count = _optional(body, "logprobs", int)
    if count is not None and not 0 <= count <= MAX_LOGPROBS:
        raise bad("logprobs", f"logprobs must be an integer from 0 to {MAX_LOGPROBS}, got {count}.")
    return count


def _logit_bias(body: dict) -> dict[int, float] | None:
    """``{"token id": bias}`` as OpenAI sends it, checked; the ids as ints (the vocabulary is checked later)."""
    bias = _optional(body, "logit_bias", dict)
    if not bias:
        return None
    if len(bias) > MAX_LOGIT_BIAS:
        raise bad("logit_bias", f"logit_bias may name at most {MAX_LOGIT_BIAS} tokens, got {len(bias)}.")
    checked = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit()) or len(key) > 12:
            raise bad("logit_bias", f'logit_bias keys must be token ids written as strings, like "50256"; got {key!r}.')
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -MAX_BIAS <= value <= MAX_BIAS:
            raise bad(
                "logit_bias", f"logit_bias values must be numbers from {-MAX_BIAS:g} to {MAX_BIAS:g}; got {value!r}."
            )
        checked[int(key)] = float(value)
    return checked


def _messages(body: dict) -> list[dict]:
    """Chat messages as ``{"role", "content"}`` with text content (text parts are joined)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", 'messages must be a non-empty array of {"role", "content"} objects.')
    cleaned = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if isinstance(message, dict) and message.get("role") == "tool":
            raise bad(param, f"{param} has role tool: labkit's server does not call tools, so it has no tool results.")
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise bad(param, f"{param} must be an object whose role is one of {', '.join(ROLES)}.")
        role = "system" if message["role"] == "developer" else message["role"]
        cleaned.append({"role": role, "content": _text_content(message.get("content"), param)})
    return cleaned


def _text_content(content: object, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(part["text"] for part in content)
    raise bad(
        f"{param}.content",
        f"{param}.content must be a string or an array of text parts "
        '({"type": "text", "text": ...}); this model reads text only.',
    )


def _prompt(body: dict) -> str | list[int]:
    """A completion prompt: text or token ids, or an array holding exactly one of those."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        return prompt
    raise bad("prompt", "prompt must be a non-empty string or array of token ids (one prompt per request).")


# --- answers ---------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; ``cached_tokens``: prompt tokens the prefix cache held when the request started."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


@dataclass(frozen=True)
class Reply:
    """What every answer to one request shares: its id, kind, model and creation time."""

    request_id: str
    kind: str
    model: str
    created: int

    @classmethod
    def new(cls, request_id: str, kind: str, model: str) -> "Reply":
        return cls(request_id, kind, model, int(time.time()))

    def _choice(
        self,
        text: str | None,
        finish_reason: str | None,
        delta: bool,
        first: bool = False,
        stop_reason=None,
        logprobs: dict | None = None,
    ) -> dict:
        """One choice; ``stop_reason`` is vLLM's: the stop string or token id that ended it, else None."""
        end = {"logprobs": logprobs, "finish_reason": finish_reason, "stop_reason": stop_reason}
        if self.kind == COMPLETION:
            return {"index": 0, "text": text or "", **end}
        if not delta:
            return {"index": 0, "message": {"role": "assistant", "content": text}, **end}
        message = {"role": "assistant"} if first else {}
        if text is not None:
            message["content"] = text
        return {"index": 0, "delta": message, **end}

    def _envelope(self, chunk: bool) -> dict:
        kind = "chat.completion" if self.kind == CHAT else "text_completion"
        return {
            "id": self.request_id,
            "object": kind + (".chunk" if chunk and self.kind == CHAT else ""),
            "created": self.created,
            "model": self.model,
        }

    def full(
        self,
        text: str,
        finish_reason: str,
        counts: dict,
        stop_reason: str | int | None = None,
        logprobs: dict | None = None,
    ) -> dict:
        """The whole answer of a non-streamed request (``logprobs``: the choice's, in its kind's shape)."""
        choice = self._choice(text, finish_reason, delta=False, stop_reason=stop_reason, logprobs=logprobs)
        return {**self._envelope(False), "choices": [choice], "usage": counts}

    def chunk(
        self,
        text: str | None,
        finish_reason: str | None = None,
        first: bool = False,
        with_usage: bool = False,
        stop_reason: str | int | None = None,
        logprobs: dict | None = None,
    ) -> dict:
        """One server-sent event of a stream: one step's text (the first also names the role) and its logprobs."""
        choice = self._choice(text, finish_reason, delta=True, first=first, stop_reason=stop_reason, logprobs=logprobs)
        event = {**self._envelope(True), "choices": [choice]}
        if with_usage:
            event["usage"] = None  # as OpenAI: null on every chunk but the last when usage is asked for
        return event

    def usage_chunk(self, counts: dict) -> dict:
        """The last event when ``stream_options.include_usage`` is set: no choices, the usage."""
        return {**self._envelope(True), "choices": [], "usage": counts}


def model_list(model: str, max_model_len: int, created: int) -> dict:
    return {
        "object": "list",
        "data": [
            {"id": model, "object": "model", "created": created, "owned_by": "labkit", "max_model_len": max_model_len}
        ],
    }


def sse_event(event: dict) -> str:
    """One server-sent event as it goes on the wire: ``data: <json>`` and a blank line."""
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
