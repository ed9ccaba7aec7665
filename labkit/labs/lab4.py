"""Lab 4, continuous batching: the checks for the learner's iteration-level scheduling decision.

The learner writes ``continuous_schedule(state) -> SchedulerOutput``: running requests get
their next tokens, then waiting requests join from the head of the queue while a batch slot,
free blocks and the token budget allow. The checks serve seeded requests on the tiny model
with that function as the engine's policy and compare each request's tokens with the request
decoded alone, watch every decision for idle slots and overfull batches, and count the steps
of the lesson's ten replies against static batching.
"""

from __future__ import annotations

from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.checking.engine_runs import (
    CheckRequest,
    compare_with_solo,
    policy_from_function,
    random_requests,
    run_failure,
    run_requests,
    serve,
    solo_oracle,
)

# The lesson's ten replies (tokens each) and its five seats: 84 steps static, 58 continuous.
TEN_REPLIES = (21, 5, 8, 47, 32, 35, 6, 3, 8, 37)
SEATS = 5

CHECK_DIALS = dict(max_num_seqs=4, num_blocks=20, block_size=4)  # small enough that memory sometimes binds


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


def _run_policy(functions, inputs):
    policy = policy_from_function(functions[0])
    return serve(inputs["requests"], policy, **inputs["dials"])


def _compare_run(expected, got) -> Mismatch | None:
    return check_decisions(got["decisions"]) or run_failure(got) or compare_with_solo(expected["solo"], got["tokens"])


register(
    Exercise(
        id="lab4.continuous_schedule",
        functions=("continuous_schedule",),
        make_inputs=lambda seed: {"requests": random_requests(seed, 14), "dials": CHECK_DIALS},
        run=_run_policy,
        oracle=solo_oracle,
        compare=_compare_run,
        tested="your policy serves 14 seeded requests arriving over time on the tiny model (4 slots, 20 blocks of 4): "
        "never more than max_num_seqs running, no slot idle while the next request fits, and every request's "
        "greedy tokens equal to decoding it alone",
        hint="Running requests first (state.reserve, then their num_missing_tokens in output.scheduled), then admit "
        "from the head of state.waiting while slots, blocks and budget allow.",
        points=2.0,
    )
)


def ten_replies() -> list[CheckRequest]:
    """The lesson's ten replies, all waiting at the start, with short distinct prompts."""
    return [CheckRequest([10 + i, 20 + i, 30 + i], length) for i, length in enumerate(TEN_REPLIES)]


def _ten_replies_steps(policy) -> int:
    """Steps the engine takes for the ten replies; an error in the learner's policy propagates."""
    llm, _ = run_requests(ten_replies(), policy, max_num_seqs=SEATS, num_blocks=64, block_size=16)
    return len(llm.trace.steps)


def _compare_steps(expected, got) -> Mismatch | None:
    if got == expected["continuous"]:
        return None
    return Mismatch(
        f"your policy took {got} steps; static batching takes {expected['static']} and continuous "
        f"batching {expected['continuous']}",
        "A finished request must free its slot for the next one on the very next step: admit "
        "whenever a slot is free, not only when the batch is empty.",
    )


register(
    Exercise(
        id="lab4.ten_replies",
        functions=("continuous_schedule",),
        make_inputs=lambda seed: None,
        run=lambda functions, inputs: _ten_replies_steps(policy_from_function(functions[0])),
        oracle=lambda inputs: {"static": _ten_replies_steps("static"), "continuous": _ten_replies_steps("continuous")},
        compare=_compare_steps,
        tested=f"the lesson's ten replies {list(TEN_REPLIES)} on {SEATS} slots take as few steps as continuous "
        "batching allows (static batching takes 84)",
        hint="Admit whenever a slot is free.",
    )
)
