"""Speculative decoding's part of the step loop, in one place: drafts before the plan, checks after the pass.

The step loop (:mod:`labkit.engine.core`) calls :class:`Speculation`'s three hooks when a proposer is on, and
nothing of speculation otherwise. A policy sees drafts only as extra missing tokens; the one helper it calls,
:func:`fit_drafts`, shrinks them before they cost anyone else a token or a block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labkit.engine.interfaces import Proposer, TailFreeingAllocator, implements
from labkit.engine.request import Request
from labkit.trace import StepRecord

if TYPE_CHECKING:
    from labkit.engine.state import SchedulerOutput, SchedulerState


class TailKeeping:
    """An allocator without ``free_tail`` (lab 5's, as a learner writes it), as rollback sees it: every call
    goes to the allocator, and ``free_tail`` keeps the blocks, which the sequence's next tokens fill (vLLM
    keeps them too); the sequence gives them back when it is freed."""

    def __init__(self, blocks):
        self.blocks = blocks

    def __getattr__(self, name: str):
        return getattr(self.blocks, name)

    def free_tail(self, seq_id: str, keep: int) -> None:
        """Keep the blocks: the allocator has no call to give back part of a table."""


def rollback_blocks(blocks):
    """The allocator rollback is handed: ``blocks`` itself if it can free a table's tail, else a :class:`TailKeeping`."""
    return blocks if implements(blocks, TailFreeingAllocator) else TailKeeping(blocks)


class Speculation:
    """The proposer's hooks into one engine core (``proposer`` drafts; ``blocks`` is the core's allocator)."""

    def __init__(self, proposer: Proposer, blocks):
        self.proposer = proposer
        self._blocks = rollback_blocks(blocks)  # the allocator, able to free_tail

    def propose(self, state: SchedulerState) -> None:
        """Give every running request that is decoding (prompt done, one token to compute) its draft tokens, never
        past ``max_tokens`` or ``max_model_len``: every token a step may emit must be one the request may still have.
        """
        k = self.proposer.num_speculative_tokens
        for request in state.running:
            request.set_drafts([])
            if not request.is_decoding or request.num_missing_tokens != 1:
                continue
            room = min(
                k,
                request.params.max_tokens - len(request.output_token_ids) - 1,
                state.max_model_len - request.num_tokens - 1,
            )
            if room > 0:
                request.set_drafts(*self.proposer.propose(request, room))
                request.trim_drafts(room)

    @staticmethod
    def fit_to_plan(state: SchedulerState, plan: SchedulerOutput) -> None:
        """Whatever the policy planned, a speculating request verifies only what it got: drafts past its tokens
        go, and an unscheduled request's drafts are dropped (any policy works, even one that knows nothing of
        drafts)."""
        for request in state.running:
            if request.spec_token_ids:
                scheduled = plan.scheduled.get(request.request_id, 0)
                request.trim_drafts(scheduled - (request.num_missing_tokens - len(request.spec_token_ids)))

    def verify(self, request: Request, drafts: list[int], tokens: list[int], record: StepRecord) -> None:
        """Book one request's verified drafts: check the answer, undo the rejected drafts' KV, count them."""
        num_accepted = check_verified(request, drafts, tokens)
        self.proposer.rollback(request, len(drafts) - num_accepted, self._blocks)
        record.num_drafts += 1
        record.num_draft_tokens += len(drafts)
        record.num_accepted_tokens += num_accepted


def check_verified(request: Request, drafts: list[int], tokens: list[int]) -> int:
    """How many drafts the verifier accepted; refuses an answer that is not (accepted drafts) + one token."""
    num_accepted = len(tokens) - 1
    if not 0 <= num_accepted <= len(drafts) or tokens[:num_accepted] != drafts[:num_accepted]:
        raise ValueError(
            f"request {request.request_id!r}: verifying the drafts {drafts} gave {tokens}, which is not an accepted "
            "prefix of the drafts followed by exactly one target token; the acceptance rule must return the drafts "
            "it accepts, in order, then the target's correction (or bonus) token"
        )
    return num_accepted


def fit_drafts(state: SchedulerState, request: Request, budget: int) -> None:
    """Speculative decoding: cut a request's draft tokens to what the token budget and free blocks allow. Drafts are
    a bet, so they shrink (or go) before the request's own next token would be cut or another request preempted.
    """
    request.trim_drafts(budget - 1)
    needed = request.num_computed_tokens + request.num_missing_tokens
    if request.spec_token_ids and not state.blocks.can_allocate(request.request_id, needed):
        request.trim_drafts(0)
