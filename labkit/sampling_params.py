"""How a request picks its tokens and when it stops, as plain data (vLLM's names).

No torch here: the scheduler and the simulator read ``max_tokens`` and the stop rules, and
only :mod:`labkit.sampling` turns the rest into tensors. Every extra below is off by default,
and a request that leaves them off is sampled exactly as before (bit for bit): the penalties,
``logit_bias`` and ``min_tokens`` are logits processors run only for the requests that set them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_LOGPROBS = 20  # the most alternatives a request may ask for per token (vLLM's default max_logprobs)
MAX_BIAS = 100.0  # logit_bias values lie in [-100, 100], as in OpenAI's API


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks tokens and when it stops (names and meanings as in vLLM).

    ``presence_penalty`` and ``frequency_penalty`` (OpenAI's, in [-2, 2]) are subtracted from the
    logit of every token already in the *output*, once or once per occurrence; ``repetition_penalty``
    (vLLM's and Hugging Face's, > 0, 1 = off) divides a positive logit, or multiplies a negative
    one, of every token in the prompt *or* the output. ``logit_bias`` adds a bias in [-100, 100] to
    the logits of the token ids it names. ``min_tokens`` forbids end-of-text and ``stop_token_ids``
    until the answer has that many tokens. ``logprobs`` asks the engine to record each output token's
    log-probability and the ``logprobs`` most likely alternatives (0: the chosen token's only), from
    the raw logits at temperature 1, before any processor (vLLM's default ``raw_logprobs``).
    """

    max_tokens: int = 64
    temperature: float = 0.0  # 0 means greedy: always the most likely token
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1  # answers per prompt; they share the prompt's KV blocks through the prefix cache
    # the extras, each off by default (after the older fields, so positional calls keep their meaning)
    min_p: float = 0.0  # 0 means off: else drop tokens less likely than min_p times the most likely one
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None  # token id -> bias added to its logit
    min_tokens: int = 0
    logprobs: int | None = None  # None: none recorded; N: the chosen token's and the N most likely

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 = off), got {self.min_p}")
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n (answers per prompt) must be a whole number >= 1, got {self.n!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2 <= value <= 2:
                raise ValueError(f"{name} must be in [-2, 2] (0 = off), got {value}")
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            raise ValueError(f"repetition_penalty must be a number > 0 (1 = off), got {self.repetition_penalty}")
        for token, bias in (self.logit_bias or {}).items():
            if not isinstance(token, int) or token < 0:
                raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            if not -MAX_BIAS <= bias <= MAX_BIAS:
                raise ValueError(f"logit_bias values must be in [-{MAX_BIAS:g}, {MAX_BIAS:g}], got {bias} for {token}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}] (or None = off), got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def processes_logits(self) -> bool:
        """True if a logits processor (a penalty, a bias, a minimum length) must run before sampling."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.min_tokens
        )


@dataclass(frozen=True)
class TokenLogprob:
    """One output token's log-probability under the model, and the ``logprobs`` most likely alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first
