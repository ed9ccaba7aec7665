"""Lab 10, exercise 3: ``measure_quality(model, round_trips, prompts, n_tokens)``, each scheme's model built from its
round trip and judged with labkit's ``quality``, against the same models built the same way (so the numbers agree to
float noise, and the models swapped show)."""

from __future__ import annotations

import functools
from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import course_model, rng
from labkit.labs.hints import register_hints
from labkit.labs.lab10.course import course_round_trips
from labkit.labs.lab10.runs import first_layers, model_with_weights
from labkit.models.quant import quality
from labkit.workloads import sharegpt_quality_prompts

QUALITY_PROMPTS = 1  # a check of the plumbing, not a quality study: the notebook measures more
QUALITY_TOKENS = 8
QUALITY_PROMPT_TOKENS = 48  # each call of quality reads the prompt three times; short keeps the check quick
QUALITY_GROUPS = (32, 64)  # the check's 4-bit groups: not labkit's 128, so quantize_model(model, "int4") shows
QUALITY_LAYERS = 4  # of the course model's 30: the same plumbing at a quarter of the cost (the LM head stays whole)


def quality_prompts(seed: int) -> list[list[dict]]:
    """``QUALITY_PROMPTS`` of the fixed quality prompts (cut to 48 tokens), picked by the seed."""
    every = sharegpt_quality_prompts(course_model().tokenizer, max_prompt_tokens=QUALITY_PROMPT_TOKENS)
    return rng(seed).sample(every, QUALITY_PROMPTS)


def quality_inputs(seed: int) -> dict[str, Any]:
    return {
        "prompts": quality_prompts(seed),
        "n_tokens": QUALITY_TOKENS,
        "group_size": rng(seed).choice(QUALITY_GROUPS),
        "seed": seed,
    }


def quality_round_trips(group_size: int) -> dict[str, Any]:
    """The round trips the check hands over: labkit's int8, and its 4-bit in groups of ``group_size``, named so."""
    trips = course_round_trips(group_size)
    return {"int8": trips["int8"], f"int4-g{group_size}": trips["int4"]}


def _run_quality(functions, inputs) -> dict[str, Any]:
    trips = quality_round_trips(inputs["group_size"])
    measured = functions[0](first_layers(course_model(), QUALITY_LAYERS), trips, inputs["prompts"], inputs["n_tokens"])
    if not isinstance(measured, dict):
        return {"returned": f"a {type(measured).__name__}"}
    others = {scheme: result for scheme, result in measured.items() if not hasattr(result, "mean_kl")}
    if others:
        scheme, result = next(iter(others.items()))
        return {"returned": f"a dict whose {scheme!r} is a {type(result).__name__} ({result!r:.40})"}
    return {"results": {str(s): [float(r.agreement), float(r.mean_kl)] for s, r in measured.items()}}


@functools.lru_cache(maxsize=4)
def _quality_oracle_for(seed: int) -> dict[str, Any]:
    """Built the learner's way (model_with_weights on the same round trips), so the numbers must agree nearly
    exactly; and with the two models swapped, the typical mistake (the KL the wrong way round)."""
    inputs, model = quality_inputs(seed), first_layers(course_model(), QUALITY_LAYERS)
    oracle: dict[str, Any] = {"results": {}, "reversed": {}, "positions": QUALITY_PROMPTS * QUALITY_TOKENS}
    for scheme, trip in quality_round_trips(inputs["group_size"]).items():
        quantized = model_with_weights(model, trip)
        for key, pair in (("results", (model, quantized)), ("reversed", (quantized, model))):
            measured = quality(*pair, inputs["prompts"], QUALITY_TOKENS)
            oracle[key][scheme] = [measured.agreement, measured.mean_kl]
    return oracle


def _same(mine: list[float], want: list[float], positions: int) -> bool:
    """Equal but for float noise: agreement to the position, KL to 0.1% (a thread count can move the last bits)."""
    return abs(mine[0] - want[0]) < 0.5 / positions and abs(mine[1] - want[1]) <= 1e-3 * abs(want[1]) + 1e-7


def _compare_quality(expected, got) -> Mismatch | None:
    if "returned" in got:
        return Mismatch(
            f"measure_quality returned {got['returned']}",
            "Return a dict, each scheme's name to what quality(model, quantized, prompts, n_tokens) returns "
            "(a Quality, with .agreement and .mean_kl), not a number taken from it.",
        )
    want, mine = expected["results"], got["results"]
    return (
        _same_schemes(want, mine)
        or _compared_with_itself(want, mine)
        or _one_model_for_all(mine)
        or _each_as_measured(expected, mine)
    )


def _same_schemes(want: dict[str, list[float]], got: dict[str, list[float]]) -> Mismatch | None:
    if set(got) != set(want):
        return Mismatch(
            f"measure_quality returned the schemes {sorted(got)}, expected {sorted(want)}",
            "Return one entry per scheme of round_trips, under the same name as in round_trips.",
        )
    return None


def _compared_with_itself(want: dict[str, list[float]], got: dict[str, list[float]]) -> Mismatch | None:
    for scheme, (agreement, kl) in got.items():
        if agreement == 1 and kl == 0:
            return Mismatch(
                f"{scheme}: agreement 100% and KL 0, labkit measures {want[scheme][0]:.1%} and {want[scheme][1]:.4f}",
                "You compared the model with itself: pass quality the original first, then the model built from the "
                "round trip.",
            )
    return None


def _one_model_for_all(got: dict[str, list[float]]) -> Mismatch | None:
    if len({tuple(v) for v in got.values()}) == 1:
        first = next(iter(got.values()))
        return Mismatch(
            f"every scheme measured the same: agreement {first[0]:.1%}, KL {first[1]:.4f}",
            "Every scheme got the same model. Build one model per scheme inside the loop, from that scheme's round "
            "trip; a lambda written in a loop reads the loop variable when it is called, not when it was written.",
        )
    return None


def _each_as_measured(expected: dict[str, Any], got: dict[str, list[float]]) -> Mismatch | None:
    """Each scheme's numbers as labkit measures the model built from its round trip; the two models swapped is named."""
    want, positions = expected["results"], expected["positions"]
    for scheme, mine in got.items():
        if _same(mine, want[scheme], positions):
            continue
        difference = (
            f"{scheme}: agreement {mine[0]:.1%} and KL {mine[1]:.5g}; the model built from this round trip "
            f"measures {want[scheme][0]:.1%} and {want[scheme][1]:.5g} on the same prompts"
        )
        if _same(mine, expected["reversed"][scheme], positions):
            return Mismatch(
                difference + ": yours are quality(quantized, model, ...), the two models the wrong way round",
                "The original comes first: its greedy tokens are the reference and the KL is KL(original || "
                "quantized), which is not symmetric. Call quality(model, quantized, prompts, n_tokens).",
            )
        return Mismatch(
            difference,
            "Build each model with model_with_weights(model, round_trip) from the round trip you were given, then "
            "call quality(model, quantized, prompts, n_tokens) with the prompts and n_tokens you were given.",
        )
    return None


def _quality_error(record: dict[str, Any]) -> str | None:
    if "quantize_model" in record["code"] or "unknown quantization scheme" in record["message"]:
        return (
            "quantize_model builds labkit's own quantized model, not the one your round trips make (and it knows "
            "only 'int8' and 'int4'): measure the round trips you are given, model_with_weights(model, round_trip)."
        )
    return None


register(
    diagnosed(
        Exercise(
            id="lab10.quality",
            functions=("measure_quality",),
            make_inputs=quality_inputs,
            run=_run_quality,
            oracle=lambda inputs: _quality_oracle_for(inputs["seed"]),
            compare=_compare_quality,
            tested=f"measure_quality on the course model's first {QUALITY_LAYERS} layers with two round trips, "
            f"labkit's int8 and its 4-bit in seeded groups of 32 or 64 ('int4-g32' or 'int4-g64'), on a seeded "
            f"ShareGPT prompt (cut to {QUALITY_PROMPT_TOKENS} tokens) x {QUALITY_TOKENS} tokens: each scheme's "
            "Quality equals (to float noise) labkit's quality of the original against the model built from that "
            "round trip",
            hint="For each scheme: build the model with model_with_weights(model, round_trip), then "
            'quality(model, that_model, prompts, n_tokens). labkit.hint("lab10.quality") shows more.',
        ),
        known=_quality_error,
    )
)

register_hints(
    "lab10.quality",
    "A round trip (quantize, then dequantize) gives the weight a quantized layer really multiplies by. Build the "
    "model from it and compare its next-token choices with the original's.",
    "For each scheme, round_trip in round_trips.items(): quantized = model_with_weights(model, round_trip); "
    "results[scheme] = quality(model, quantized, prompts, n_tokens). Return results.",
    "return {scheme: quality(model, model_with_weights(model, trip), prompts, n_tokens) "
    "for scheme, trip in round_trips.items()}",
)
