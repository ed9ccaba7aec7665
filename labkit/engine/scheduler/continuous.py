"""Continuous batching, first come first served (Orca's iteration-level scheduling).

Every step, the running requests decode one token each; then new requests join from the
head of the queue while a batch slot (``max_num_seqs``), free blocks and the token budget
allow. A prompt is prefilled whole, in the step it joins. Finished requests leave at once,
so their slots and blocks go to the next in line the very next step.
"""

from __future__ import annotations

from labkit.engine.scheduler.base import PolicyBase, schedule_running
from labkit.engine.state import SchedulerOutput, SchedulerState


class ContinuousBatching(PolicyBase):
    name = "continuous"

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        output = SchedulerOutput()
        budget = schedule_running(state, output, state.max_num_batched_tokens, self.chunked)
        if output.preempted:
            return output  # blocks are short: let the survivors finish before admitting more
        while state.waiting and len(state.running) < state.max_num_seqs and budget > 0:
            request = state.waiting[0]
            wanted = request.num_missing_tokens
            if wanted > budget and not self.chunked:
                break
            num_new = min(wanted, budget)
            if not state.blocks.can_allocate(request.request_id, num_new):
                break
            state.admit(request, num_new)
            output.scheduled[request.request_id] = num_new
            budget -= num_new
        return output
