"""Lab 4, the scheduling policy: continuous batching served on the tiny model, and the lesson's ten replies counted."""

from __future__ import annotations

import functools

from labkit.engine.scheduler import policy_from_function
from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed, raised_mismatch
from labkit.labs.common.engine_runs import CheckRequest, random_requests, run_requests, serve
from labkit.labs.common.learner_errors import noting_errors
from labkit.labs.common.scheduling import SCHEDULING_ANSWERS, check_decisions
from labkit.labs.common.solo import compare_with_solo, run_failure, solo_oracle
from labkit.labs.hints import register_hints

# The lesson's ten replies (tokens each) and its five seats: 84 steps static, 58 continuous.
TEN_REPLIES = (21, 5, 8, 47, 32, 35, 6, 3, 8, 37)
SEATS = 5

CHECK_DIALS = dict(max_num_seqs=4, num_blocks=20, block_size=4)  # small enough that memory sometimes binds


def _run_policy(functions, inputs):
    schedule, raised = noting_errors(functions[0])
    return {**serve(inputs["requests"], policy_from_function(schedule), **inputs["dials"]), "raised": raised[:1]}


def _compare_run(expected, got) -> Mismatch | None:
    if got["raised"]:
        record = got["raised"][0]
        hint = 'labkit.hint("lab4.continuous_schedule") shows the next hint.'
        if record["error"] == "OutOfBlocksError":
            hint = "Admit a request only if state.blocks.can_allocate(its id, its tokens) says its blocks are free."
        return raised_mismatch(record, hint)
    return check_decisions(got["decisions"]) or run_failure(got) or compare_with_solo(expected["solo"], got["tokens"])


register(
    Exercise(
        id="lab4.continuous_schedule",
        functions=("continuous_schedule",),
        answers=SCHEDULING_ANSWERS,
        make_inputs=lambda seed: {"requests": random_requests(seed, 14), "dials": CHECK_DIALS},
        run=_run_policy,
        oracle=solo_oracle,
        compare=_compare_run,
        tested="your policy serves 14 seeded requests arriving over time on the tiny model (4 slots, 20 blocks of 4): "
        "never more than max_num_seqs running, no slot idle while the next request fits, and every request's "
        "greedy tokens equal to decoding it alone",
        hint="Running requests first, each given its missing tokens; then newcomers from the head of the queue while "
        'a seat, the blocks and the token budget allow. labkit.hint("lab4.continuous_schedule") shows more.',
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


@functools.lru_cache(maxsize=1)  # the same ten replies for every seed and every submission
def _course_steps() -> dict[str, int]:
    return {"static": _ten_replies_steps("static"), "continuous": _ten_replies_steps("continuous")}


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
    diagnosed(
        Exercise(
            id="lab4.ten_replies",
            functions=("continuous_schedule",),
            answers=SCHEDULING_ANSWERS,
            make_inputs=lambda seed: None,
            run=lambda functions, inputs: _ten_replies_steps(policy_from_function(functions[0])),
            oracle=lambda inputs: dict(_course_steps()),
            compare=_compare_steps,
            tested=f"the lesson's ten replies {list(TEN_REPLIES)} on {SEATS} slots take as few steps as continuous "
            "batching allows (static batching takes 84)",
            hint='Admit whenever a slot is free. labkit.hint("lab4.ten_replies") shows more.',
        )
    )
)

register_hints(
    "lab4.continuous_schedule",
    "Every step is a new decision. Whoever is running keeps going; whoever finished has already left, so their "
    "seats and blocks are free for the next in line right now, not when the whole batch is done.",
    "Two phases. First the running requests, oldest first: reserve room for their missing tokens (a reservation "
    "may preempt someone; skip a request that is no longer RUNNING) and schedule them. Then, unless someone was "
    "preempted, admit from the head of the queue while a seat is free and its whole prompt fits the budget and "
    "the free blocks; stop at the first that does not fit.",
    "state.reserve(request, n, output) returns False if request itself was preempted; "
    "state.blocks.can_allocate(head.request_id, n) and state.admit(head, n); output.scheduled[id] = n; "
    "budget = state.max_num_batched_tokens, minus what you schedule.",
)
register_hints(
    "lab4.ten_replies",
    "This check counts steps. A seat that frees after step 5 should be taken at step 6, not when the batch empties.",
    "If your policy admits only when state.running is empty, it is static batching. Admit whenever "
    "len(state.running) < state.max_num_seqs.",
)
