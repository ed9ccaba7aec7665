"""The engine's state machine: the queues, the block pool and the moves between them, with no tensors and no clock.

Each step the engine (or the simulator) calls ``policy.schedule(state)``. The policy moves
requests between ``state.waiting`` and ``state.running`` with the state's moves (``admit``,
``reserve``, which preempts when blocks run out), and returns a :class:`SchedulerOutput`: how many
new tokens each chosen request computes this step, and whom it preempted. Whoever drives the step
then runs it (a model or a cost model) and books it with :meth:`SchedulerState.complete_step`.
The policies themselves live in :mod:`labkit.engine.scheduler`.

With prefix caching, the state gives the head of the waiting queue its cached prefix before
a policy looks at it (its ``num_computed_tokens`` starts past the cached blocks, which it
holds), so a policy needs no change: it sees fewer missing tokens, and ``admit`` and
``blocks.can_allocate`` count only the blocks for the tokens it schedules.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable, cast

from labkit.engine.interfaces import BlockAllocator, PrefixCachingAllocator, require
from labkit.engine.request import Request, RequestStatus
from labkit.trace import StepRecord

# speculative decoding's hook into complete_step: verify(request, drafts, tokens, record)
VerifyHook = Callable[[Request, list[int], list[int], StepRecord], None]

CHUNKED_TOKEN_BUDGET = 512  # default max_num_batched_tokens with chunked prefill (a CPU-sized chunk)
UNCHUNKED_TOKEN_BUDGET = 2048  # without chunking: at least this, and at least max_model_len (as vLLM V0)


def token_budget(max_num_batched_tokens: int | None, max_model_len: int, chunked: bool) -> int:
    """The per-step token budget: the one given, or the default; refused if a prompt could never run."""
    budget = max_num_batched_tokens or (CHUNKED_TOKEN_BUDGET if chunked else max(max_model_len, UNCHUNKED_TOKEN_BUDGET))
    if not chunked and budget < max_model_len:
        raise ValueError(
            f"max_num_batched_tokens={budget} is below max_model_len={max_model_len}, "
            "so a long prompt could never run whole; raise it, lower max_model_len, "
            "or enable chunked prefill"
        )
    return budget


@dataclass
class SchedulerOutput:
    """One step's plan. ``scheduled`` keeps batch order: request id -> new tokens to compute."""

    scheduled: dict[str, int] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)
    slots_held: int | None = None  # batch slots taken; None means one per scheduled request

    @property
    def num_tokens(self) -> int:
        return sum(self.scheduled.values())

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class SchedulerState:
    """The queues, the block pool and the limits a policy works with."""

    def __init__(
        self,
        blocks: BlockAllocator,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_prefix_caching: bool = False,
        choose_victim: Callable[[SchedulerState, Request], Request] | None = None,
    ):
        for name, value in [
            ("max_num_seqs", max_num_seqs),
            ("max_num_batched_tokens", max_num_batched_tokens),
            ("max_model_len", max_model_len),
        ]:
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if enable_prefix_caching:
            require(blocks, "prefix caching")
        self.blocks = blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.choose_victim = choose_victim or newest  # whom reserve() preempts when blocks run out
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()  # arrived and not running, in serving order
        self.running: list[Request] = []  # admitted, oldest first
        self.requests: dict[str, Request] = {}  # every unfinished request, by id
        self.now = 0.0  # set by the driver before each schedule()
        self.num_preemptions = 0
        self.prefix_cache_queries = 0  # this step's: prompt tokens of admitted requests
        self.prefix_cache_hits = 0  # ... of which found in the cache

    @property
    def _prefix_cache(self) -> PrefixCachingAllocator:
        """The pool as a prefix cache: with prefix caching on, ``__init__`` checked it has the calls."""
        return cast(PrefixCachingAllocator, self.blocks)

    # --- arrivals --------------------------------------------------------------------
    def rejection(self, request: Request) -> str | None:
        """Why a request can never be served here, or None if it can."""
        prompt, limit = request.num_prompt_tokens, self.max_model_len
        if prompt >= limit:
            return (
                f"prompt has {prompt} tokens but max_model_len is {limit}, which leaves no room "
                "for output; shorten the prompt or raise max_model_len"
            )
        # The last output token is never fed back, so the cache holds at most total - 1 tokens.
        worst = min(prompt + request.params.max_tokens, limit) - 1
        capacity = self.blocks.num_blocks * self.blocks.block_size
        if worst > capacity:
            return (
                f"request may need {worst} tokens of KV cache but the whole cache holds {capacity}; "
                "add blocks (num_blocks or gpu_memory_utilization) or lower max_tokens"
            )
        return None

    def add(self, request: Request) -> bool:
        """Queue an arrived request; reject it (finished, with a message) if it can never fit."""
        reason = self.rejection(request)
        if reason is not None:
            request.mark_finished("rejected", self.now, message=reason)
            return False
        self.requests[request.request_id] = request
        self.waiting.append(request)
        return True

    # --- moves a policy makes --------------------------------------------------------
    def admit(self, request: Request, num_tokens: int) -> None:
        """Move the head of the waiting queue to running, with blocks for ``num_tokens`` tokens."""
        if not self.waiting or self.waiting[0] is not request:
            raise ValueError(f"only the head of the waiting queue can be admitted, not {request.request_id!r}")
        self.blocks.allocate(request.request_id, request.num_computed_tokens + num_tokens)
        self.waiting.popleft()
        self.running.append(request)
        request.mark_running(self.now)
        if self.enable_prefix_caching:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += request.num_computed_tokens
            self.look_up_head()

    def look_up_head(self) -> None:
        """Give the head of the queue its longest cached prefix: it holds those blocks and starts past them.

        Called before each schedule and after each admission, so a policy always sees the head's
        real missing tokens. At least the last token is left to compute: its logits give the next token.
        """
        if not self.enable_prefix_caching or not self.waiting or self.waiting[0].num_computed_tokens:
            return
        head = self.waiting[0]
        head.num_computed_tokens = self._prefix_cache.take_cached_prefix(head.request_id, head.all_token_ids[:-1])

    def _release_head_prefix(self) -> bool:
        """The head lets go of its cached prefix (to be looked up again later); False if it held none."""
        head = self.waiting[0] if self.waiting else None
        if head is None or not head.num_computed_tokens:
            return False
        self.blocks.free(head.request_id)
        head.num_computed_tokens = 0
        return True

    def preempt(self, request: Request) -> None:
        """Recompute preemption: free its blocks and put it at the front of the queue."""
        self.running.remove(request)
        self.blocks.free(request.request_id)
        request.mark_preempted()
        self._release_head_prefix()  # only the head holds a cached prefix
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def reserve(self, request: Request, num_new_tokens: int, output: SchedulerOutput) -> bool:
        """Make room for a running request's next tokens, preempting whom ``choose_victim`` names (by default
        the newest) while blocks run out.

        Returns False if the request had to preempt itself. Running requests come before the head's
        cached prefix: the head lets go of it before anyone is preempted.
        """
        needed = request.num_computed_tokens + num_new_tokens
        while not self.blocks.can_allocate(request.request_id, needed):
            if self._release_head_prefix():
                continue
            victim = self.choose_victim(self, request)
            if not any(victim is running for running in self.running):
                raise ValueError(
                    f"choose_victim chose {getattr(victim, 'request_id', victim)!r}, which is not running, so "
                    "preempting it frees no block; return one of state.running"
                )
            self.preempt(victim)
            output.preempted.append(victim.request_id)
            output.scheduled.pop(victim.request_id, None)
            if victim is request:
                return False
        self.blocks.allocate(request.request_id, needed)
        return True

    # --- after the step ----------------------------------------------------------------
    def finish(self, request: Request, reason: str) -> None:
        """A running request is done: release its blocks and forget it."""
        self.running.remove(request)
        self.blocks.free(request.request_id)
        del self.requests[request.request_id]
        request.mark_finished(reason, self.now)

    def complete_step(
        self,
        plan: SchedulerOutput,
        new_tokens: dict[str, int | list[int]],
        eos_token_ids: list[int],
        index: int,
        start: float,
        end: float,
        verify: VerifyHook | None = None,
    ) -> tuple[StepRecord, list[Request]]:
        """Book a step that ran ``plan`` from ``start`` to ``end`` and sampled ``new_tokens``.

        Describes the step, then advances each request: its computed tokens, its blocks named for
        the prefix cache, its new tokens (stamped ``end``) until one stops it. Returns the record and
        the requests that got a token. A speculating request gets a list: its accepted drafts and one
        of the target's; ``verify(request, drafts, tokens, record)`` (speculative decoding's hook,
        :mod:`labkit.engine.speculation`) checks them and undoes the rejected drafts' KV.
        """
        work = [(self.requests[request_id], num_new) for request_id, num_new in plan.scheduled.items()]
        record = self._record_step(plan, work, index, start, end)
        self.now = end
        progressed = []
        for request, num_new in work:
            tokens = _as_list(new_tokens.get(request.request_id))
            drafts = request.spec_token_ids
            request.set_drafts([])
            request.num_computed_tokens += num_new
            if drafts and tokens:
                if verify is None:
                    raise ValueError(f"request {request.request_id!r} verified drafts but no verify hook was given")
                verify(request, drafts, tokens, record)
            self._cache_full_blocks(request, num_new, tokens)
            if tokens:  # none for a prompt chunk: its first token comes with the last chunk
                self._append_tokens(request, tokens, eos_token_ids, end)
                progressed.append(request)
        return record, progressed

    def _record_step(
        self, plan: SchedulerOutput, work: list[tuple[Request, int]], index: int, start, end
    ) -> StepRecord:
        """The step as the trace keeps it: who ran with how many tokens, the queues and the pool before it ran."""
        num_prefill = sum(request.split_new_tokens(num_new)[0] for request, num_new in work)
        record = StepRecord(
            index=index,
            start=start,
            end=end,
            scheduled=dict(plan.scheduled),
            num_prefill_tokens=num_prefill,
            num_decode_tokens=plan.num_tokens - num_prefill,
            slots_held=len(plan.scheduled) if plan.slots_held is None else plan.slots_held,
            num_waiting=len(self.waiting),
            blocks_used=self.blocks.num_used_blocks,
            blocks_total=self.blocks.num_blocks,
            preempted=list(plan.preempted),
            context_tokens=sum(request.num_computed_tokens for request, _ in work),
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
        )
        self.prefix_cache_queries = self.prefix_cache_hits = 0
        return record

    def _append_tokens(self, request: Request, tokens: list[int], eos_token_ids: list[int], end: float) -> None:
        """Give the request its new tokens in order, until one stops it (none past a stop)."""
        for token in tokens:
            request.append_token(token, end)
            reason = request.stop_reason(eos_token_ids, self.max_model_len)
            if reason:
                self.finish(request, reason)
                return

    def _cache_full_blocks(self, request: Request, num_new: int, new_tokens: list[int]) -> None:
        """If the step filled a block of the request, name it so later requests can find it.

        Only verified tokens name blocks: those computed, all of them final (``new_tokens``, this
        step's, are not yet appended). The token list is built only when a block was filled.
        """
        size, computed = self.blocks.block_size, request.num_computed_tokens
        if self.enable_prefix_caching and computed // size > (computed - num_new) // size:
            token_ids = (request.all_token_ids + new_tokens)[:computed]
            self._prefix_cache.cache_full_blocks(request.request_id, token_ids)

    def abort(self, request: Request) -> None:
        """Drop an unfinished request wherever it is (its client went away): its blocks are freed now."""
        if request.status is RequestStatus.RUNNING:
            self.finish(request, "abort")
            return
        if request is self.waiting[0]:
            self._release_head_prefix()
        self.waiting.remove(request)
        del self.requests[request.request_id]
        request.mark_finished("abort", self.now)

    # --- hand-offs between engines (prefill on one, decode on another) -----------------
    def hand_over(self, request: Request) -> None:
        """A running request leaves for another engine: its blocks go back to this pool now; it keeps its tokens
        and its progress (``num_computed_tokens``), which travel with it."""
        self.running.remove(request)
        self.blocks.free(request.request_id)
        del self.requests[request.request_id]

    def adopt(self, request: Request) -> Sequence[int]:
        """A request handed over by another engine joins ``running`` with blocks for its computed tokens, allocated
        here through the allocator; returns its block table, whose blocks the caller fills with the request's K/V.
        With prefix caching the full blocks are named, so later requests find the handed-over prompt."""
        request_id, computed = request.request_id, request.num_computed_tokens
        table = self.blocks.allocate(request_id, computed)
        if self.enable_prefix_caching:
            self._prefix_cache.cache_full_blocks(request_id, request.all_token_ids[:computed])
        self.requests[request_id] = request
        self.running.append(request)
        request.mark_running(self.now)
        return table

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)


def newest(state: SchedulerState, request: Request) -> Request:
    """The default victim, as vLLM's: the request that joined last, with the least work to redo."""
    return state.running[-1]


def _as_list(tokens: int | list[int] | None) -> list[int]:
    """A request's sampled tokens as a list: none, one, or (speculating) several."""
    return [] if tokens is None else [tokens] if isinstance(tokens, int) else list(tokens)
