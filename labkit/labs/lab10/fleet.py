"""Lab 10, exercise 4: ``fewest_gpus(load_per_s, inputs) -> (tensor_parallel, replicas)``, the fewest GPUs that
carry a load, against ``labkit.capacity.size_fleet``; a typical wrong replica count is named when it explains every
answer."""

from __future__ import annotations

import math
from typing import Any

from labkit.capacity import SALE_70B_EXAMPLE, SALE_EXAMPLE, sale_load, size_fleet, with_precision
from labkit.capacity.parallel import LLAMA_3_1_70B
from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints

SPLITS = (1, 2, 4, 8)
# Loads of the 8B bot that are exactly k of its one-card replicas' worth (sale_load(k) / that replica's load is k
# in floats too), and where int(x) + 1 in place of a ceiling changes the fewest GPUs.
EXACT_MULTIPLES = (3, 5, 9, 13, 17)


def fleet_cases(seed: int) -> list[dict[str, Any]]:
    """The 10x sale of the 70B bot, then seeded loads on other cards, with int4 weights, for the 8B bot, an
    exact multiple of what one replica of the 8B bot carries, and a promise no split keeps (the answer: None)."""
    r = rng(seed)
    exact = r.choice(EXACT_MULTIPLES)
    return [
        dict(name="the 70B bot, a 10x sale", load=sale_load(10), inputs=dict(SALE_70B_EXAMPLE)),
        dict(
            name="the 70B bot on H100s",
            load=sale_load(r.uniform(3, 12)),
            inputs=dict(SALE_70B_EXAMPLE, hardware="h100-sxm"),
        ),
        dict(
            name="the 70B bot with int4 weights",
            load=sale_load(r.uniform(4, 12)),
            inputs=dict(SALE_70B_EXAMPLE, model=with_precision(LLAMA_3_1_70B, weights="int4")),
        ),
        dict(
            name="the 8B bot on H200s",
            load=sale_load(r.uniform(5, 25)),
            inputs=dict(SALE_EXAMPLE, hardware="h200"),
        ),
        dict(name=f"the 8B bot, exactly {exact} cards' worth", load=sale_load(exact), inputs=dict(SALE_EXAMPLE)),
        dict(name="the 8B bot under a 3 ms promise", load=sale_load(1), inputs=dict(SALE_EXAMPLE, promise_s=0.003)),
    ]


def _run_fleet(functions, cases) -> list[list[int] | None]:
    answers = []
    for case in cases:
        answer = functions[0](case["load"], dict(case["inputs"]))
        answers.append(None if answer is None else [int(x) for x in answer])
    return answers


# The typical wrong replica counts, as (load, one replica's plan) -> replicas, and the hint that names each.
WRONG_REPLICAS = {
    "rounded down": (
        lambda load, replica: math.floor(load / replica.promise_load_per_s),
        "You rounded the replicas down (int() or //): a load of 3.4 replicas' worth needs 4 of them. Round up: "
        "math.ceil(load_per_s / promise_load_per_s).",
    ),
    "int + 1": (
        lambda load, replica: int(load / replica.promise_load_per_s) + 1,
        "int(x) + 1 is not a ceiling: when the load is an exact multiple of what one replica carries, it rents "
        "one replica too many. Use math.ceil(load_per_s / promise_load_per_s).",
    ),
    "request ceiling": (
        lambda load, replica: math.ceil(load / replica.request_ceiling_per_s),
        "Size by promise_load_per_s, not the request ceiling: at the ceiling users wait far longer than the "
        "promise between tokens.",
    ),
}


def _fleet_oracle(cases) -> list[dict[str, Any]]:
    expected = []
    for case in cases:
        try:
            sizing = size_fleet(case["load"], **case["inputs"])
        except ValueError as error:  # no split keeps the promise: no fleet does
            expected.append({"name": case["name"], "load": case["load"], "needed": {}, "why_none": str(error)})
            continue
        fits = [o for o in sizing.options if o.plan is not None]
        variants = {}
        for name, (replicas, _) in WRONG_REPLICAS.items():
            counts = {o.tensor_parallel: replicas(case["load"], o.plan) for o in fits}
            variants[name] = {"replicas": counts, "fewest": min(n * r for n, r in counts.items())}
        expected.append(
            {
                "name": case["name"],
                "load": case["load"],
                "needed": {o.tensor_parallel: o.replicas for o in fits},
                "carried": {o.tensor_parallel: _carried(o.plan) for o in fits},
                "fewest": min(o.gpus for o in fits if o.gpus is not None),
                "variants": variants,
                "why_not": {o.tensor_parallel: o.why_not for o in sizing.options if o.plan is None},
            }
        )
    return expected


def _carried(replica) -> float:
    return replica.request_ceiling_per_s if replica.promise_load_per_s is None else replica.promise_load_per_s


def _wrong_rule(expected, got) -> str | None:
    """The typical wrong replica count that gives every one of the learner's answers, if one does."""
    pairs = [(case, answer) for case, answer in zip(expected, got) if case["needed"]]
    for name in WRONG_REPLICAS:
        variants = [(case["variants"][name], answer) for case, answer in pairs]
        if all(v["replicas"].get(n) == r and n * r == v["fewest"] for v, (n, r) in variants):
            return name
    return None


def _compare_fleet(expected, got) -> Mismatch | None:
    """Every answer's form first (None, or a split that works), then the counts, so that a wrong rule for the
    replicas is named when it explains every answer."""
    for case, answer in zip(expected, got):
        mistake = _answer_form(case, answer)
        if mistake is not None:
            return mistake
    rule = _wrong_rule(expected, got)
    for case, answer in zip(expected, got):
        mistake = _fleet_size(case, answer, rule)
        if mistake is not None:
            return mistake
    return None


def _load_described(case: dict[str, Any]) -> str:
    return f"{case['name']}, {case['load']:.1f} requests/s"


def _answer_form(case: dict[str, Any], answer: list[int] | None) -> Mismatch | None:
    """None exactly when no split keeps the promise; else two numbers, a split that works first."""
    where = _load_described(case)
    if not case["needed"]:
        if answer is not None:
            return Mismatch(
                f"{where}: you returned {answer}, but no split keeps this promise ({case['why_none']})",
                "When plan raises ValueError for every split, no fleet keeps the promise: return None.",
            )
        return None
    if answer is None:
        return Mismatch(
            f"{where}: fewest_gpus returned None, but {case['fewest']} GPUs carry it",
            "Return None only when every split raises ValueError; here some split keeps the promise.",
        )
    if len(answer) != 2:
        return Mismatch(f"{where}: fewest_gpus returned {answer}", "Return two numbers: (tensor_parallel, replicas).")
    ways = answer[0]
    if ways not in case["needed"]:
        why = case["why_not"].get(ways, f"tensor_parallel must be one of {SPLITS}")
        return Mismatch(f"{where}: tensor_parallel={ways} is not a plan that works here: {why}")
    return None


def _fleet_size(case: dict[str, Any], answer: Any, rule: str | None) -> Mismatch | None:
    """Just enough replicas for the split chosen, and no fleet of fewer GPUs; ``rule`` names the wrong count."""
    if not case["needed"]:
        return None
    (ways, replicas), where, needed = answer, _load_described(case), case["needed"]
    want = needed[ways]
    if replicas != want:
        carried = case["carried"][ways]
        return Mismatch(
            f"{where}: with {ways} GPU{'s' if ways > 1 else ''} a replica carries {carried:.2f} requests/s within the promise, so it "
            f"takes ceil({case['load']:.2f} / {carried:.2f}) = {want} replicas; you said {replicas}",
            WRONG_REPLICAS[rule][1]
            if rule
            else "The replicas are ceil(load / what one replica carries within the promise).",
        )
    if ways * replicas != case["fewest"]:
        best = min(needed, key=lambda n: n * needed[n])
        return Mismatch(
            f"{where}: {ways} x {replicas} = {ways * replicas} GPUs, but {best} x {needed[best]} = "
            f"{case['fewest']} GPUs carry it too",
            WRONG_REPLICAS[rule][1]
            if rule
            else "Try every split (1, 2, 4 and 8 GPUs a replica), count each fleet's GPUs (N x replicas: a "
            "replica of N GPUs costs N) and keep the fewest.",
        )
    return None


def _fleet_error(record: dict[str, Any]) -> str | None:
    if record["error"] == "ValueError" and any(
        words in record["message"] for words in ("do not fit", "not one conversation", "cannot share", "no load keeps")
    ):
        return (
            "plan raises ValueError for a split where the model does not fit (the 70B weights on one card) or no "
            "load keeps the promise. That split is simply not an option: catch the error (try / except "
            "ValueError) and go on to the next; if every split raises, return None."
        )
    return None


register(
    diagnosed(
        Exercise(
            id="lab10.fleet",
            functions=("fewest_gpus",),
            make_inputs=fleet_cases,
            run=_run_fleet,
            oracle=_fleet_oracle,
            compare=_compare_fleet,
            tested="fewest_gpus on the 10x sale of the 70B bot, 3 seeded loads (70B on H100s, 70B with int4 "
            "weights, 8B on H200s) and a load of the 8B bot that is an exact multiple of what one replica carries, "
            "under the 50 ms promise, and the 8B bot under a 3 ms promise no split keeps (None): as few GPUs in all "
            "as labkit.capacity.size_fleet finds (any split of that many), with just enough replicas for the split "
            "chosen",
            hint="For each split N in (1, 2, 4, 8): plan(**inputs, tensor_parallel=N) (skip it if that raises "
            "ValueError), replicas = ceil(load / promise_load_per_s); keep the fewest N x replicas. "
            'labkit.hint("lab10.fleet") shows more.',
        ),
        known=_fleet_error,
    )
)

register_hints(
    "lab10.fleet",
    "A split that fits gives a replica; the promise says how many requests/s one replica carries; the load says "
    "how many replicas. Of all the splits, the cheapest fleet is the one with the fewest GPUs.",
    "For N in (1, 2, 4, 8): try p = plan(**inputs, tensor_parallel=N), except ValueError: skip N. replicas = "
    "math.ceil(load_per_s / p.promise_load_per_s). Keep the (N, replicas) with the smallest N * replicas.",
    "best = None; for n in (1, 2, 4, 8): try: p = plan(**inputs, tensor_parallel=n) except ValueError: continue; "
    "r = math.ceil(load_per_s / p.promise_load_per_s); if best is None or n * r < best[0] * best[1]: best = (n, r)",
)
