"""What happened during a run, step by step and request by request.

The real engine and the simulator both write a :class:`Trace`, so the metrics and
every plot work on either. Times are seconds on one clock (wall or simulated).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class RequestRecord:
    """One request's life: when it arrived, ran, produced each token and finished."""

    request_id: str
    arrival_time: float
    prompt_len: int
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # one per output token
    finish_time: float | None = None
    num_preemptions: int = 0
    finish_reason: str | None = None  # "stop", "length" or "rejected"

    @property
    def output_len(self) -> int:
        return len(self.token_times)

    @property
    def first_token_time(self) -> float | None:
        return self.token_times[0] if self.token_times else None


@dataclass
class StepRecord:
    """One forward pass: who ran, with how many tokens, and the state of the queues."""

    index: int
    start: float
    end: float
    scheduled: dict[str, int]  # request id -> tokens computed this step
    num_prefill_tokens: int
    num_decode_tokens: int
    slots_held: int  # sequences holding a batch slot (static batching keeps finished ones)
    num_waiting: int
    blocks_used: int = 0
    blocks_total: int = 0
    preempted: list[str] = field(default_factory=list)
    context_tokens: int = 0  # KV entries the step read: tokens its requests had computed (or found cached) before it
    prefix_cache_queries: int = 0  # prompt tokens of the requests admitted this step (vLLM's name)
    prefix_cache_hits: int = 0  # ... of which found in the prefix cache, not computed
    num_drafts: int = 0  # speculative decoding: requests that verified drafts this step
    num_draft_tokens: int = 0  # ... the draft tokens they verified (vLLM: spec_decode_num_draft_tokens)
    num_accepted_tokens: int = 0  # ... of which accepted (vLLM: spec_decode_num_accepted_tokens)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def num_active(self) -> int:
        return len(self.scheduled)


@dataclass
class Trace:
    """A whole run: its requests, its steps, and free-form facts about the setup.

    With a ``window`` (a long-running server's), it keeps only the last ``window`` steps and
    finished requests (and every unfinished one), so memory stays bounded however long it runs;
    ``num_steps`` still counts every step and step indexes keep counting. Metrics over such a
    trace cover the window.
    """

    requests: list[RequestRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    window: int | None = None  # None: keep everything
    num_steps: int = 0  # steps recorded, kept or not

    def add_step(self, record: StepRecord) -> None:
        """Record a step; with a window, forget what fell out of it."""
        self.steps.append(record)
        self.num_steps += 1
        if self.window is None:
            return
        del self.steps[: len(self.steps) - self.window]
        if len(self.requests) > 2 * self.window:  # trimmed in batches: each trim walks the whole list
            self._forget_old_requests()

    def _forget_old_requests(self) -> None:
        finished = [record for record in self.requests if record.finish_time is not None]
        old = {id(record) for record in finished[: max(len(finished) - self.window, 0)]}
        self.requests[:] = [record for record in self.requests if id(record) not in old]

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self)))
