"""Static batching: fill a batch, run it until its longest member ends, then fill the next.

This is what ``generate`` on a padded batch does. A member that finishes early keeps its
batch slot (reported as ``slots_held``) until the whole batch is done, so the step runs
fewer useful sequences than it holds: the waste continuous batching removes.
"""

from __future__ import annotations

from labkit.engine.request import Request, RequestStatus
from labkit.engine.scheduler.base import PolicyBase, schedule_running
from labkit.engine.state import SchedulerOutput, SchedulerState


class StaticBatching(PolicyBase):
    name = "static"

    def __init__(self) -> None:
        self.batch: list[Request] = []

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        if not any(member.status is RequestStatus.RUNNING for member in self.batch):
            self.batch = []
            while (
                state.waiting
                and len(self.batch) < state.max_num_seqs
                and state.blocks.can_allocate(state.waiting[0].request_id, state.waiting[0].num_missing_tokens)
            ):
                request = state.waiting[0]
                state.admit(request, request.num_missing_tokens)
                self.batch.append(request)
        output = SchedulerOutput(slots_held=len(self.batch))
        schedule_running(state, output, state.max_num_batched_tokens, chunked=False)
        return output
