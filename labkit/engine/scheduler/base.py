"""The base of every scheduler policy: what a policy is, and how it gives running requests their tokens.

A policy plans one step with the moves of :class:`~labkit.engine.state.SchedulerState` (the engine's
state machine, in :mod:`labkit.engine.state`) and returns a :class:`~labkit.engine.state.SchedulerOutput`.
"""

from __future__ import annotations

from labkit.engine.request import RequestStatus
from labkit.engine.speculation import fit_drafts
from labkit.engine.state import SchedulerOutput, SchedulerState


class PolicyBase:
    """Decides, each step, who runs and how many tokens each computes: subclass it and write ``schedule``, or write
    any object that follows :class:`labkit.engine.interfaces.SchedulerPolicy` (the contract; this is a start)."""

    name = "policy"
    # True if the policy may split a prompt over several steps; then the engine allows a token
    # budget below max_model_len (a prompt no longer has to fit one step whole).
    chunked = False

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        raise NotImplementedError


def schedule_running(state: SchedulerState, output: SchedulerOutput, budget: int, chunked: bool) -> int:
    """Give running requests their tokens: decodes first, then unfinished prompts, oldest first.

    Without chunking, a prompt runs whole or waits for a step with room. Returns the budget left.
    """
    order = [r for r in state.running if r.is_decoding] + [r for r in state.running if not r.is_decoding]
    for request in order:
        if request.status is not RequestStatus.RUNNING:
            continue  # preempted earlier in this loop
        if request.spec_token_ids:
            fit_drafts(state, request, budget)
        wanted = request.num_missing_tokens
        num_new = min(wanted, budget) if chunked else (wanted if wanted <= budget else 0)
        if num_new == 0:
            continue
        if state.reserve(request, num_new, output):
            output.scheduled[request.request_id] = num_new
            budget -= num_new
    return budget
