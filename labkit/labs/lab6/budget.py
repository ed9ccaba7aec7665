"""Lab 6, exercise 2: the largest token budget whose full step the cost model predicts within an ITL promise;
:func:`largest_budget` is the course's answer (the notebook then tries the learner's on the real engine)."""

from __future__ import annotations

import dataclasses
from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints
from labkit.sim.cost_model import CostModel, get_model
from labkit.sim.hardware import get_hardware

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
        if have > want["budget"]:
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

register_hints(
    "lab6.choose_budget",
    "cost.pass_time(new_tokens, context_tokens) predicts a step's seconds. It never falls when new_tokens grows, "
    "so the budgets that keep the promise are 1, 2, ... up to some largest one.",
    "Either search (a binary search over 1 .. 16,384 keeps it fast) for the largest budget with "
    "cost.pass_time(budget, context_tokens) * 1000 <= itl_ms, or solve the cost model's formula for new_tokens.",
    "low, high = 0, 16384; while low < high: middle = (low + high + 1) // 2; keep middle as low if it fits, "
    "else high = middle - 1; return low.",
)
