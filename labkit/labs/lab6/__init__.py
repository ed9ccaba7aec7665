"""Lab 6, chunked prefill: the checks for the learner's token-budget policy, budget choice and chunk plan.

- ``chunked_schedule(state) -> SchedulerOutput``: every decoding request gets its one token first,
  then prompts (running ones mid-prefill, then new ones from the queue) get chunks of whatever budget
  ``max_num_batched_tokens`` leaves. Served on the tiny model with seeded requests plus one long
  prompt that arrives mid-run, every step watched: under budget, no decode skipped for a prompt, no
  budget left idle while a prompt waits, and each request's tokens equal to decoding it alone.
- ``choose_budget(cost, itl_ms, context_tokens) -> int``: the largest budget whose full step the
  cost model predicts within an inter-token-latency promise (the notebook then checks it on the
  real engine with a cost model fitted on the machine).
- ``prefill_chunks(prompt_len, budget, num_decoding) -> list[int]``: the decode-first chunks of a
  long prompt, checked by arithmetic and against the learner's own policy in the engine.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed, raised_mismatch
from labkit.labs.common.engine_runs import CheckRequest, policy_from_function, random_requests, serve
from labkit.labs.common.learner_errors import noting_errors
from labkit.labs.common.scheduling import SCHEDULING_ANSWERS, check_decisions
from labkit.labs.common.shared import rng
from labkit.labs.common.solo import compare_with_solo, run_failure, solo_oracle
from labkit.labs.hints import register_hints
from labkit.sim.cost_model import CostModel, get_model
from labkit.sim.hardware import get_hardware

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

# --- lab6.choose_budget: the largest token budget that keeps an ITL promise -------------------

MAX_BUDGET = 16_384  # the largest budget the exercise asks about


def budget_cases(seed: int) -> list[dict[str, Any]]:
    """Cost models (two GPUs serving Llama 3.1 8B, a CPU-sized one), promises and contexts, seeded; then the
    range's two ends: a promise even one token breaks, and one the largest budget keeps."""
    r = rng(seed)
    # calibrated models read the KV context at a cost of their own (attention_s_per_token), as labkit calibrate fits
    gpu = dataclasses.replace(
        CostModel.from_parts(get_hardware("h100-sxm"), get_model("llama-3.1-8b"), overhead_s=0.004),
        attention_s_per_token=2e-8,
    )
    big = dataclasses.replace(
        CostModel.from_parts(get_hardware("b200"), get_model("llama-3.1-8b"), overhead_s=0.003),
        attention_s_per_token=1e-8,
    )
    cpu = dataclasses.replace(
        gpu,
        bandwidth=20e9,
        flops=3e11,
        weight_bytes=5.4e8,
        flops_per_token=2.7e8,
        overhead_s=0.01,
        attention_s_per_token=2e-5,
    )
    cases = []
    for cost, promise_range, context_range in (
        (gpu, (30, 80), (20_000, 60_000)),
        (big, (15, 40), (20_000, 60_000)),
        (cpu, (60, 400), (500, 4_000)),
    ):
        context = r.randint(*context_range)
        floor_ms = cost.pass_time(1, context) * 1000
        promise = round(max(r.uniform(*promise_range), 1.5 * floor_ms), 1)
        cases.append({"cost": cost, "itl_ms": promise, "context_tokens": context})
    # the two ends of the range: a promise no step keeps (the answer is 0), one that a full 16,384-token step keeps
    context = r.randint(500, 4_000)
    cases.append({"cost": cpu, "itl_ms": round(0.8 * cpu.pass_time(1, context) * 1000, 1), "context_tokens": context})
    context = r.randint(20_000, 60_000)
    generous = round(1.2 * gpu.pass_time(MAX_BUDGET, context) * 1000, 1)
    cases.append({"cost": gpu, "itl_ms": generous, "context_tokens": context})
    return cases


def largest_budget(cost: CostModel, itl_ms: float, context_tokens: int) -> int:
    """The largest budget (1 .. MAX_BUDGET) whose step the cost model predicts within itl_ms; 0 if none."""
    low, high = 0, MAX_BUDGET
    while low < high:
        middle = (low + high + 1) // 2
        if cost.pass_time(middle, context_tokens) * 1000 <= itl_ms:
            low = middle
        else:
            high = middle - 1
    return low


def _budget_oracle(cases) -> dict[str, Any]:
    out = []
    for case in cases:
        cost, promise, context = case["cost"], case["itl_ms"], case["context_tokens"]
        out.append(
            {
                "budget": largest_budget(cost, promise, context),
                "one_token_ms": cost.pass_time(1, context) * 1000,
                "mistakes": {
                    "you compared seconds with milliseconds: pass_time is in seconds, the promise in ms": [
                        largest_budget(cost, promise * 1000, context),
                        largest_budget(cost, promise / 1000, context),
                    ],
                    "you left out the KV context the step reads: the step reads every token already in the "
                    "cache (context_tokens), and that takes time too": [largest_budget(cost, promise, 0)],
                },
            }
        )
    return {"inputs": [{"itl_ms": case["itl_ms"]} for case in cases], "cases": out}


def _run_budget(functions, cases) -> list[Any]:
    return [functions[0](case["cost"], case["itl_ms"], case["context_tokens"]) for case in cases]


def _compare_budget(expected, got) -> Mismatch | None:
    for index, (case, want, have) in enumerate(zip(expected["inputs"], expected["cases"], got)):
        if have == want["budget"]:
            continue
        where = f"case {index + 1}"
        if not isinstance(have, int) or isinstance(have, bool):
            return Mismatch(f"{where}: expected a whole number of tokens, got {have!r:.60}", "Return an int.")
        for mistake, wrongs in want["mistakes"].items():
            if have in wrongs and have != want["budget"]:
                return Mismatch(f"{where}: expected a budget of {want['budget']} tokens, got {have}", mistake)
        if want["budget"] == 0:
            return Mismatch(
                f"{where}: even a step of 1 token is predicted at {want['one_token_ms']:.1f} ms, over the promise of "
                f"{case['itl_ms']} ms, so no budget keeps it: expected 0, got {have}",
                'When even one token breaks the promise, return 0: the exercise\'s answer for "no budget keeps it". '
                "A search that starts at a budget of 1 can never say so; start it at 0, which trivially keeps it.",
            )
        if want["budget"] == MAX_BUDGET and have == MAX_BUDGET - 1:
            return Mismatch(
                f"{where}: the whole range keeps this promise, so the answer is its top, {MAX_BUDGET}; got {have}",
                f"The budgets go from 1 to {MAX_BUDGET:,} inclusive: your search stops one short of the top.",
            )
        if have == want["budget"] + 1 or have > want["budget"]:
            return Mismatch(
                f"{where}: a budget of {have} tokens breaks the promise; the largest that keeps it is {want['budget']}",
                "A step of budget tokens must take no longer than the promise: check cost.pass_time(budget, "
                "context_tokens) * 1000 <= itl_ms for the budget you return.",
            )
        return Mismatch(
            f"{where}: a budget of {have} tokens keeps the promise, but so does {want['budget']}, which is larger",
            "Return the largest budget that keeps the promise: a bigger budget prefills prompts in fewer steps.",
        )
    return None


register(
    diagnosed(
        Exercise(
            id="lab6.choose_budget",
            functions=("choose_budget",),
            answers=("labkit.labs.lab6.largest_budget",),
            make_inputs=budget_cases,
            run=_run_budget,
            oracle=_budget_oracle,
            compare=_compare_budget,
            tested="choose_budget(cost, itl_ms, context_tokens) on three seeded cases (Llama 3.1 8B on an H100 and a "
            "B200, a CPU-sized model), then a promise that even one token breaks (the answer is 0) and one a step of "
            f"{MAX_BUDGET:,} tokens keeps: the largest budget whose step cost.pass_time predicts within the promise",
            hint="A step's time grows with the tokens it computes; find where it reaches the promise. "
            'labkit.hint("lab6.choose_budget") shows more.',
        )
    )
)

# --- lab6.prefill_chunks: how a long prompt is cut when others are decoding --------------------


def chunks_oracle(prompt_len: int, budget: int, num_decoding: int) -> list[int]:
    """Decode-first: each step the prompt gets what num_decoding decodes leave of the budget."""
    room = budget - num_decoding
    full, rest = divmod(prompt_len, room)
    return [room] * full + ([rest] if rest else [])


def chunk_cases(seed: int) -> list[tuple[int, int, int]]:
    """(prompt_len, budget, num_decoding): seeded, plus an exact multiple and a prompt that fits one step."""
    r = rng(seed)
    room = r.randint(8, 20)
    decoding = r.randint(1, 4)
    return [
        (r.randint(40, 120), room + decoding, decoding),
        (3 * room, room + decoding, decoding),
        (room - 2, room + decoding, decoding),
        (r.randint(30, 90), r.randint(10, 30), 0),
    ]


def engine_chunks(policy, prompt_len: int, budget: int, num_decoding: int, seed: int) -> list[int] | dict:
    """The chunks the engine gives a prompt that arrives while ``num_decoding`` requests decode."""
    r = rng(seed)
    chatting = [CheckRequest([r.randint(2, 255) for _ in range(4)], 60) for _ in range(num_decoding)]
    document = CheckRequest([r.randint(2, 255) for _ in range(prompt_len)], 1, arrival=6.0)
    run = serve(
        chatting + [document],
        policy,
        max_num_seqs=num_decoding + 1,
        num_blocks=64,
        block_size=8,
        max_num_batched_tokens=budget,
    )
    if run["error"]:
        return run
    doc_id = f"r{num_decoding}"
    return [d["scheduled"][doc_id] for d in run["decisions"] if doc_id in d["scheduled"]]


def _run_chunks(functions, inputs) -> dict[str, Any]:
    predict, schedule = functions
    prompt_len, budget, decoding = inputs["engine_case"]
    return {
        "predicted": [list(predict(*case)) for case in inputs["cases"]],
        "engine": engine_chunks(policy_from_function(schedule, chunked=True), prompt_len, budget, decoding, 0),
    }


def _compare_chunks(expected, got) -> Mismatch | None:
    if got["engine"] != expected["engine"]:
        return Mismatch(
            f"your chunked_schedule cut a {expected['engine_case'][0]}-token prompt into {got['engine']!s:.120} "
            f"while {expected['engine_case'][2]} requests decoded, not {expected['engine']}; this exercise predicts "
            "what exercise 1's policy does",
            "Fix exercise 1 first, then run this check again (its check says what to fix).",
        )
    for (prompt_len, budget, decoding), want, have in zip(expected["cases"], expected["chunks"], got["predicted"]):
        if have == want:
            continue
        where = f"a {prompt_len}-token prompt, budget {budget}, {decoding} decoding"
        hint = (
            "Each step the decodes take their tokens first; the prompt gets the rest, and its last chunk is the rest."
        )
        if decoding and have == chunks_oracle(prompt_len, budget, 0):
            hint = f"Each step the {decoding} decoding requests take one token each before the prompt gets any."
        elif sum(have) > prompt_len:
            hint = "The chunks add up to more than the prompt: the last chunk is only what is left of it."
        elif sum(have) < prompt_len:
            hint = "The chunks add up to less than the prompt: the last, shorter chunk is missing."
        return Mismatch(f"{where}: expected chunks {want}, got {have}", hint)
    return None


def _chunk_inputs(seed: int) -> dict[str, Any]:
    cases = chunk_cases(seed)
    return {"cases": cases, "engine_case": cases[0]}


register(
    diagnosed(
        Exercise(
            id="lab6.prefill_chunks",
            functions=("prefill_chunks", "chunked_schedule"),
            answers=("labkit.labs.lab6.chunks_oracle", *CHUNKED_ANSWERS),
            make_inputs=_chunk_inputs,
            run=_run_chunks,
            oracle=lambda inputs: {
                "cases": inputs["cases"],
                "engine_case": inputs["engine_case"],
                "chunks": [chunks_oracle(*case) for case in inputs["cases"]],
                "engine": chunks_oracle(*inputs["engine_case"]),
            },
            compare=_compare_chunks,
            tested="prefill_chunks(prompt_len, budget, num_decoding) on four seeded cases (one an exact multiple, one "
            "shorter than a step) gives decode-first chunks, and your chunked_schedule cuts the first case's prompt "
            "the same way in the engine",
            hint="Count what the decoding requests take from each step's budget; the prompt gets the rest. "
            'labkit.hint("lab6.prefill_chunks") shows more.',
        )
    )
)

# --- hints, from the idea to near-code (labkit.hint) ------------------------------------------

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
register_hints(
    "lab6.choose_budget",
    "cost.pass_time(new_tokens, context_tokens) predicts a step's seconds. It never falls when new_tokens grows, "
    "so the budgets that keep the promise are 1, 2, ... up to some largest one.",
    "Either search (a binary search over 1 .. 16,384 keeps it fast) for the largest budget with "
    "cost.pass_time(budget, context_tokens) * 1000 <= itl_ms, or solve the cost model's formula for new_tokens.",
    "low, high = 0, 16384; while low < high: middle = (low + high + 1) // 2; keep middle as low if it fits, "
    "else high = middle - 1; return low.",
)
register_hints(
    "lab6.prefill_chunks",
    "Decodes first: every step, each decoding request takes one token of the budget before the prompt gets any.",
    "room = budget - num_decoding tokens a step for the prompt: as many full chunks of room as fit, then the "
    "remainder if there is one.",
    "full, rest = divmod(prompt_len, budget - num_decoding); [room] * full + ([rest] if rest else []).",
)
