"""What the checks of a learner's scheduling policy share (labs 4, 6 and 9): labkit's own policy kept out of the
learner's reach, and the watch on every decision for an overfull batch or an idle slot.
"""

from __future__ import annotations

from typing import Any

from labkit.grading.result import Mismatch

# labkit's continuous batching, out of reach while a learner's policy is checked (labs 4, 6 and 9): the policy
# (and so ChunkedPrefill, its subclass) and the step it starts with; the check's engine runs the learner's policy.
SCHEDULING_ANSWERS = (
    "labkit.engine.scheduler.continuous.ContinuousBatching",
    "labkit.engine.scheduler.base.schedule_running",
)


def check_decisions(decisions: list[dict[str, Any]], chunked: bool = False) -> Mismatch | None:
    """The first decision that overfills the batch or leaves a slot idle while the head of the queue fits."""
    for step, d in enumerate(decisions):
        if d["running"] > d["max_num_seqs"]:
            return Mismatch(
                f"step {step}: {d['running']} requests were running, but max_num_seqs is {d['max_num_seqs']}",
                "Admit a waiting request only while len(state.running) < state.max_num_seqs.",
            )
        fits = d["head_fits_chunk"] if chunked else d["head_fits_whole"]
        if d["running"] < d["max_num_seqs"] and d["waiting"] and fits and not d["preempted"]:
            room = "a chunk of its prompt" if chunked else f"its {d['head_tokens']} prompt tokens"
            return Mismatch(
                f"step {step}: only {d['running']} of {d['max_num_seqs']} slots were in use while "
                f"{d['head']} waited, and {room} had blocks and budget",
                "After scheduling the running requests, keep admitting from the head of state.waiting "
                "(state.admit) while a slot, free blocks and the token budget allow. Waiting for the "
                "whole batch to finish is static batching.",
            )
    return None
