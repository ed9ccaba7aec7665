"""Lab 6, chunked prefill: the checks for the learner's token-budget policy.

The learner writes ``chunked_schedule(state) -> SchedulerOutput``: every decoding request
gets its one token first, then prompts (running ones mid-prefill, then new ones from the
queue) get chunks of whatever budget ``max_num_batched_tokens`` leaves. The check serves
seeded requests plus one long prompt that arrives mid-run, on the tiny model, and watches
every step: under budget, no decode skipped for a prompt, no budget left idle while a
prompt waits, and each request's tokens equal to decoding it alone.
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
    serve,
    solo_oracle,
)
from labkit.labs.checking.shared import rng
from labkit.labs.lab4 import check_decisions

BUDGET = 24
CHECK_DIALS = dict(max_num_seqs=5, num_blocks=64, block_size=8, max_num_batched_tokens=BUDGET)
LONG_PROMPT = 100  # tokens: four budgets' worth


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
    return serve(inputs["requests"], policy_from_function(functions[0], chunked=True), **CHECK_DIALS)


def _compare(expected, got) -> Mismatch | None:
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
        make_inputs=lambda seed: {"requests": long_prompt_requests(seed)},
        run=_run,
        oracle=solo_oracle,
        compare=_compare,
        tested=f"your policy serves 9 seeded chats plus a {LONG_PROMPT}-token prompt arriving mid-run, on the tiny model "
        f"with a budget of {BUDGET} tokens a step: no step over budget, every decoding request gets its token "
        "every step, no budget idle while a prompt waits, and every request's tokens equal to decoding it alone",
        hint="1. every decoding request: 1 token; 2. running requests still in their prompt: a chunk of "
        "min(num_missing_tokens, budget left); 3. admit from the queue with chunks while slots, blocks and budget allow.",
        points=2.0,
    )
)
