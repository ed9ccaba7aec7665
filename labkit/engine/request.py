"""A request's life in the engine: its tokens, its progress, and the times its record keeps.

Plain Python, shared by the real engine and the simulator. Progress is counted the vLLM V1 way: no "prefill phase"
flag, only ``num_computed_tokens`` (tokens whose K/V are cached) against ``num_tokens`` (prompt plus output so far).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from labkit.sampling_params import SamplingParams, TokenLogprob
from labkit.trace import RequestRecord


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # arrived, holds no blocks (new, or preempted and back in the queue)
    RUNNING = "running"  # admitted: holds blocks and is scheduled every step it fits
    FINISHED = "finished"  # done: finish_reason says why ("stop", "length" or "rejected")


@dataclass
class Request:
    """One prompt being served, picking its tokens and stopping as ``params`` says."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = 0.0
    prompt: object = None  # the text or chat messages it came from, for the output
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    message: str | None = None  # why it was rejected
    # Speculative decoding: draft tokens proposed for this step, to be verified (and their draft
    # probabilities, when the proposer has them). Scheduled like missing tokens, never part of the output.
    spec_token_ids: list[int] = field(default_factory=list)
    spec_draft_probs: Any = None  # a torch tensor [drafts, vocab] or None (Any: this module loads no torch)
    parent_id: str | None = None  # one of n answers to a prompt: it waits until this sibling's prompt is cached
    output_logprobs: list[TokenLogprob] = field(default_factory=list)  # one per output token, if params.logprobs
    record: RequestRecord = field(init=False)
    _prefill_target: int = field(init=False)  # tokens to compute before decoding starts

    def __post_init__(self):
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id!r} has an empty prompt; give at least one token")
        self.record = RequestRecord(self.request_id, self.arrival_time, len(self.prompt_token_ids))
        self._prefill_target = len(self.prompt_token_ids)

    # --- sizes ---------------------------------------------------------------------
    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output so far: the sequence the cache must eventually hold."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_missing_tokens(self) -> int:
        """Tokens still to compute before the next output token can be sampled (draft tokens included)."""
        return self.num_tokens + len(self.spec_token_ids) - self.num_computed_tokens

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def set_drafts(self, token_ids: list[int], probs: object = None) -> None:
        self.spec_token_ids = list(token_ids)
        self.spec_draft_probs = probs

    def trim_drafts(self, keep: int) -> None:
        """Keep only the first ``keep`` draft tokens (the step has no room for more)."""
        keep = max(0, keep)
        self.spec_token_ids = self.spec_token_ids[:keep]
        if self.spec_draft_probs is not None:
            self.spec_draft_probs = self.spec_draft_probs[:keep] if keep else None

    @property
    def is_decoding(self) -> bool:
        """True once the prompt (or a recompute after preemption) is done: one token per step."""
        return self.num_computed_tokens >= self._prefill_target

    def split_new_tokens(self, num_new: int) -> tuple[int, int]:
        """How many of ``num_new`` tokens computed from here are (prefill, decode) tokens."""
        prefill = max(0, min(num_new, self._prefill_target - self.num_computed_tokens))
        return prefill, num_new - prefill

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    # --- state changes (times are on the engine clock) -----------------------------
    def mark_running(self, now: float) -> None:
        self.status = RequestStatus.RUNNING
        if self.record.first_scheduled_time is None:
            self.record.first_scheduled_time = now

    def mark_preempted(self) -> None:
        """Recompute-style preemption: forget the cache, keep the tokens, wait again."""
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.set_drafts([])
        self._prefill_target = self.num_tokens
        self.record.num_preemptions += 1

    def append_token(self, token_id: int, now: float) -> None:
        self.output_token_ids.append(token_id)
        self.record.token_times.append(now)

    def mark_finished(self, reason: str, now: float, message: str | None = None) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.message = message
        self.record.finish_reason = reason
        self.record.finish_time = now

    @property
    def num_preemptions(self) -> int:
        return self.record.num_preemptions

    def stop_reason(self, eos_token_ids: list[int], max_model_len: int) -> str | None:
        """'stop' after an end token, 'length' at max_tokens or max_model_len, else None."""
        params = self.params
        last = self.output_token_ids[-1]
        if last in params.stop_token_ids or (not params.ignore_eos and last in eos_token_ids):
            return "stop"
        if len(self.output_token_ids) >= params.max_tokens or self.num_tokens >= max_model_len:
            return "length"
        return None


@dataclass
class CompletionOutput:
    """One answer to a prompt (vLLM's name): with ``SamplingParams(n=...)`` a prompt has several."""

    index: int
    token_ids: list[int]
    text: str | None
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token, with SamplingParams(logprobs=N); else None


@dataclass
class RequestOutput:
    """What the engine hands back for a request: its tokens so far, and whether it is done.

    ``text`` is decoded once the request finishes (None before, and for a model without tokenizer). ``outputs``
    lists the prompt's answers, as in vLLM: several with ``SamplingParams(n=...)`` (``token_ids`` and ``text``
    are then the first answer's), else one.
    """

    request_id: str
    prompt: object
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finished: bool
    finish_reason: str | None = None
    message: str | None = None
    num_preemptions: int = 0
    outputs: list[CompletionOutput] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # one per token, with SamplingParams(logprobs=N); else None

    def __post_init__(self):
        if not self.outputs:
            self.outputs = [CompletionOutput(0, self.token_ids, self.text, self.finish_reason, self.logprobs)]
