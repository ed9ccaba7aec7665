"""Lab 6, exercise 1: a chunked-prefill policy served on the tiny model, every step watched (decodes first, then
prompt chunks of what the budget leaves)."""

from __future__ import annotations

from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import raised_mismatch
from labkit.labs.common.engine_runs import CheckRequest, policy_from_function, random_requests, serve
from labkit.labs.common.learner_errors import noting_errors
from labkit.labs.common.scheduling import SCHEDULING_ANSWERS, check_decisions
from labkit.labs.common.shared import rng
from labkit.labs.common.solo import compare_with_solo, run_failure, solo_oracle
from labkit.labs.hints import register_hints

BUDGET = 24
CHECK_DIALS = dict(max_num_seqs=5, num_blocks=64, block_size=8, max_num_batched_tokens=BUDGET)
LONG_PROMPT = 100  # tokens: four budgets' worth


CHUNKED_ANSWERS = ("labkit.engine.scheduler.chunked.ChunkedPrefill", *SCHEDULING_ANSWERS)


def long_prompt_requests(seed: int) -> list[CheckRequest]:
    """Seeded short requests, plus a prompt of LONG_PROMPT tokens arriving while they decode."""
    requests = random_requests(seed, 9, prompt_range=(3, 12), output_range=(6, 20), arrival_span=12)
    r = rng(seed + 1)
    document = CheckRequest([r.randint(2, 255) for _ in range(LONG_PROMPT)], 4, arrival=8.0)
    return sorted(requests + [document], key=lambda request: request.arrival)


def check_budget_and_order(decisions: list[dict[str, Any]]) -> Mismatch | None:
    """The first step over budget, or one where a prompt chunk ran while a decoding request got nothing."""
    for step, d in enumerate(decisions):
        total = sum(d["scheduled"].values())
        if total > d["budget"]:
            return Mismatch(
                f"step {step} computes {total} tokens ({d['scheduled']}), over the budget of {d['budget']}",
                "Keep a running count of the budget left and never give a request more than it: "
                "a prompt that does not fit gets a chunk of min(num_missing_tokens, budget left).",
            )
        if d["decoding_not_scheduled"] and d["prefill"] and not d["preempted"]:
            return Mismatch(
                f"step {step}: {d['decoding_not_scheduled']} were decoding but got no token, while "
                f"prompt chunks took {sum(d['prefill'].values())} tokens",
                "Decodes first: give every decoding request (request.is_decoding) its one token "
                "before any prompt chunk, or a long prompt freezes everyone else.",
            )
    return None


def _run(functions, inputs) -> dict[str, Any]:
    schedule, raised = noting_errors(functions[0])
    return {**serve(inputs["requests"], policy_from_function(schedule, chunked=True), **CHECK_DIALS), "raised": raised}


def _compare(expected, got) -> Mismatch | None:
    if got["raised"]:
        return raised_mismatch(got["raised"][0], 'labkit.hint("lab6.chunked_schedule") shows the next hint.')
    return (
        check_budget_and_order(got["decisions"])
        or check_decisions(got["decisions"], chunked=True)
        or run_failure(got)
        or compare_with_solo(expected["solo"], got["tokens"])
    )


register(
    Exercise(
        id="lab6.chunked_schedule",
        functions=("chunked_schedule",),
        answers=CHUNKED_ANSWERS,
        make_inputs=lambda seed: {"requests": long_prompt_requests(seed)},
        run=_run,
        oracle=solo_oracle,
        compare=_compare,
        tested=f"your policy serves 9 seeded chats plus a {LONG_PROMPT}-token prompt arriving mid-run, on the tiny model "
        f"with a budget of {BUDGET} tokens a step: no step over budget, every decoding request gets its token "
        "every step, no budget idle while a prompt waits, and every request's tokens equal to decoding it alone",
        hint="Decoding requests first, one token each; then prompts, running ones before new ones, get chunks of "
        'what is left of the budget. labkit.hint("lab6.chunked_schedule") shows more.',
        points=2.0,
    )
)

register_hints(
    "lab6.chunked_schedule",
    "The budget is shared by everyone in the step. Users who are mid-answer need only one token each, and they "
    "are the ones who notice a stall, so they are served first; prompts get what is left, in pieces if need be.",
    "Two lists of running requests: decoding (request.is_decoding) first, then those still in their prompt. Give "
    "each min(its missing tokens, budget left), skip zeros, reserve before scheduling, and skip anyone a "
    "reservation preempted. Then, unless someone was preempted, admit from the queue while a seat and budget are "
    "left and the blocks for its chunk are free.",
    "n = min(request.num_missing_tokens, budget); if n and state.reserve(request, n, output): "
    "output.scheduled[request.request_id] = n; budget -= n. Admission: n = min(head.num_missing_tokens, budget); "
    "state.blocks.can_allocate(head.request_id, n); state.admit(head, n).",
)
