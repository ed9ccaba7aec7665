"""The step loop both clocks share: one engine core, two executors.

One step: requests whose arrival time has passed join the queue, the head of the queue
takes its cached prefix (with prefix caching), the policy plans the step, an *executor* runs the plan, every request whose missing tokens are now all
computed gets a token, finished requests leave, and the step goes into the trace.
Everything here is plain Python with no tensors and no clock of its own. The real engine
(:class:`labkit.engine.LLM`) passes an executor that runs the model and reads the wall
clock; the simulator (:func:`labkit.sim.simulator.simulate`) passes one that asks the cost
model how long the pass takes. So a policy makes the same plans, and the same mistakes
raise the same errors, on both clocks.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable, cast

from labkit.engine.interfaces import PrefixCacheLookup, Proposer, SchedulerPolicy, implements
from labkit.engine.request import Request
from labkit.engine.speculation import Speculation
from labkit.engine.state import SchedulerState
from labkit.trace import StepRecord, Trace


@dataclass(frozen=True)
class Batch:
    """One planned step as an executor sees it: who computes how many new tokens, and who samples."""

    work: list[tuple[Request, int]]  # (request, new tokens), in the plan's order
    samplers: frozenset[str]  # ids of the requests that get a token: none of their tokens is missing afterwards

    @property
    def num_tokens(self) -> int:
        return sum(num_new for _, num_new in self.work)

    @property
    def context_tokens(self) -> int:
        """KV cache entries the step reads: the tokens each request had computed before it."""
        return sum(request.num_computed_tokens for request, _ in self.work)


NEW_SEQUENCE = "<hand-off>"  # a sequence id that holds no blocks: can_allocate for it counts a whole new table

# executor(batch, start) -> (request id -> sampled token for every sampler, the time the step ended).
# A speculating sampler gets a list instead: its accepted draft tokens and one token of the target's own.
Executor = Callable[[Batch, float], tuple[dict[str, "int | list[int]"], float]]


@dataclass
class StepOutcome:
    """What one call of :meth:`EngineCore.step` changed."""

    rejected: list[Request] = field(default_factory=list)  # arrived, but can never fit: finished with a message
    progressed: list[Request] = field(default_factory=list)  # got a token (and maybe finished)
    record: StepRecord | None = None  # None: nothing ran, the engine is idle until the next arrival


class EngineCore:
    """Arrivals, the policy, and the bookkeeping of each step, for any executor."""

    def __init__(
        self,
        policy: SchedulerPolicy,
        state: SchedulerState,
        eos_token_ids: list[int],
        proposer: Proposer | None = None,
    ):
        self.policy = policy
        self.state = state
        self.proposer = proposer  # None: no speculative decoding
        self.speculation = None if proposer is None else Speculation(proposer, state.blocks)
        self.eos_token_ids = list(eos_token_ids)
        self.trace = Trace()
        self._pending: list[tuple[float, int, Request]] = []  # not yet arrived: (arrival, order, request)
        self._pending_ids: set[str] = set()
        self._held: list[Request] = []  # arrived answers of an n > 1 prompt, waiting for a sibling's prompt
        self._order = itertools.count()

    def add(self, request: Request) -> None:
        """Queue a request; it joins the scheduler once the clock passes its arrival time."""
        request_id = request.request_id
        if request_id in self.state.requests or request_id in self._pending_ids:
            raise ValueError(f"request id {request_id!r} is already in use; pick another or pass None")
        heapq.heappush(self._pending, (request.arrival_time, next(self._order), request))
        self._pending_ids.add(request_id)
        self.trace.requests.append(request.record)

    def has_unfinished(self) -> bool:
        return bool(self._pending) or bool(self._held) or self.state.has_unfinished

    def abort(self, request_id: str) -> bool:
        """Stop a request that has not finished, arrived or not; False if there is none by that id."""
        if request_id in self._pending_ids:
            index = next(i for i, (_, _, r) in enumerate(self._pending) if r.request_id == request_id)
            request = self._pending.pop(index)[2]
            heapq.heapify(self._pending)
            self._pending_ids.discard(request_id)
            request.mark_finished("abort", self.state.now)
            return True
        held = next((r for r in self._held if r.request_id == request_id), None)
        if held is not None:
            self._held.remove(held)
            held.mark_finished("abort", self.state.now)
            return True
        if request_id not in self.state.requests:
            return False
        self.state.abort(self.state.requests[request_id])
        return True

    def cached_tokens(self, request: Request) -> int:
        """Tokens of ``request``'s prompt this engine's prefix cache holds now (0 with prefix caching off)."""
        blocks = self.state.blocks
        if not self.state.enable_prefix_caching or not implements(blocks, PrefixCacheLookup):
            return 0
        return cast(PrefixCacheLookup, blocks).cached_tokens(request.prompt_token_ids)

    # --- hand-offs: prefill on one engine, decode on another ---------------------------------
    def ready_to_hand_over(self) -> list[Request]:
        """Running requests whose prompt is computed and whose first token is out, nothing else missing: what a
        prefill engine hands to a decode engine (oldest first)."""
        return [
            request for request in self.state.running if request.output_token_ids and request.num_missing_tokens == 1
        ]

    def hand_over(self, request_id: str) -> tuple[Request, list[int]]:
        """Take a request out of this engine for another to continue: its blocks go back now, and the request, with
        its tokens and progress, is returned with the block table it had (read its K/V from those blocks before the
        next step reuses them)."""
        request = self.state.requests.get(request_id)
        if request is None:
            where = "has not arrived yet" if request_id in self._pending_ids else "is not unfinished here"
            raise ValueError(f"request {request_id!r} {where}; only a running request can be handed over")
        if self.speculation is not None:
            raise ValueError("hand-offs are not supported with speculative decoding; turn speculative_config off")
        if request not in self.state.running:
            raise ValueError(
                f"request {request_id!r} is waiting (not yet admitted, or preempted), so it holds no KV to hand over; "
                "step the engine until its prefill is done"
            )
        if not request.output_token_ids or request.num_missing_tokens != 1:
            raise ValueError(
                f"request {request_id!r} has computed {request.num_computed_tokens} of its "
                f"{request.num_prompt_tokens} prompt tokens; hand it over after its prefill, once its first token is "
                "out (ready_to_hand_over() lists those)"
            )
        table = list(self.state.blocks.block_table(request_id))
        self.state.hand_over(request)
        return request, table

    def can_adopt(self, num_computed_tokens: int) -> bool:
        """Whether a handed-over request with this many computed tokens fits now: a free seat and enough blocks."""
        state = self.state
        if len(state.running) >= state.max_num_seqs:
            return False
        return state.blocks.can_allocate(NEW_SEQUENCE, num_computed_tokens)

    def adopt(self, request: Request) -> Sequence[int]:
        """Continue a request another engine handed over (:meth:`hand_over`): it joins the running requests with
        blocks for its computed tokens; returns their table, for the caller to fill with its K/V."""
        request_id, state = request.request_id, self.state
        if request_id in state.requests or request_id in self._pending_ids:
            raise ValueError(f"request id {request_id!r} is already in use on this engine; hand it to another one")
        if self.speculation is not None:
            raise ValueError("hand-offs are not supported with speculative decoding; turn speculative_config off")
        reason = state.rejection(request)
        if reason is not None:
            raise ValueError(f"request {request_id!r} cannot be served here: {reason}")
        if not self.can_adopt(request.num_computed_tokens):
            free = state.max_num_seqs - len(state.running)
            raise ValueError(
                f"no room for request {request_id!r} now ({free} free seats of max_num_seqs={state.max_num_seqs}; "
                f"it needs blocks for {request.num_computed_tokens} tokens): ask can_adopt() first and retry after a "
                "step frees some"
            )
        table = state.adopt(request)
        self.trace.requests.append(request.record)
        return table

    @property
    def next_arrival(self) -> float | None:
        """When the next request not yet arrived arrives, or None."""
        return self._pending[0][0] if self._pending else None

    def step(self, now: float, execute: Executor) -> StepOutcome:
        """Admit arrivals up to ``now``, plan one step, run it with ``execute`` and book it."""
        state = self.state
        state.now = now
        outcome = StepOutcome(rejected=self._admit_arrivals(now))
        state.look_up_head()
        if self.speculation is not None:
            self.speculation.propose(state)
        plan = self.policy.schedule(state)
        if plan.is_empty:
            # Nothing ran, so nothing would change before the next arrival: a policy that plans
            # nothing while arrived requests wait or run would stall for ever.
            if state.has_unfinished:
                raise RuntimeError(
                    f"policy {self.policy.name!r} scheduled nothing although requests are "
                    "unfinished; it must give running requests their tokens and admit the "
                    "head of the queue when blocks allow"
                )
            return outcome
        work = [(state.requests[request_id], num_new) for request_id, num_new in plan.scheduled.items()]
        if self.speculation is not None:
            self.speculation.fit_to_plan(state, plan)
        samplers = frozenset(request.request_id for request, num_new in work if request.num_missing_tokens == num_new)
        tokens, end = execute(Batch(work, samplers), now)
        verify = None if self.speculation is None else self.speculation.verify
        record, outcome.progressed = state.complete_step(
            plan, tokens, self.eos_token_ids, self.trace.num_steps, now, end, verify=verify
        )
        self.trace.add_step(record)
        outcome.record = record
        return outcome

    def _admit_arrivals(self, now: float) -> list[Request]:
        """Move arrived requests into the queue; return those rejected as never fitting."""
        rejected, arrived = [], []
        while self._pending and self._pending[0][0] <= now:
            request = heapq.heappop(self._pending)[2]
            self._pending_ids.discard(request.request_id)
            arrived.append(request)
        ready, self._held = self._held, []
        for request in ready + arrived:
            if self._waits_for_sibling(request):
                self._held.append(request)
            elif not self.state.add(request):
                rejected.append(request)
        return rejected

    def _waits_for_sibling(self, request: Request) -> bool:
        """One of n answers joins once its sibling's prompt is computed, so it finds those blocks cached
        (vLLM shares them the same way); at once if the sibling is gone or prefix caching is off."""
        parent_id = request.parent_id
        if parent_id is None or not self.state.enable_prefix_caching:
            return False
        if parent_id in self._pending_ids:
            return True
        parent = self.state.requests.get(parent_id)
        return parent is not None and parent.num_computed_tokens < parent.num_prompt_tokens
