"""Lab 2, exercise 4: how many conversations' KV caches fit beside the weights in a GPU's memory."""

from __future__ import annotations

import math

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints

GB = 1e9


def _fit_inputs(seed: int) -> tuple[list[tuple[float, float, int, int, float]]]:
    pick = rng(seed)
    cases = [
        (24 * GB, 16 * GB, 131072, 8192, 0.85),  # an 8B model in 16 bits on a 24 GB card, 8K-token chats
        (80 * GB, 16 * GB, 131072, 1300, 0.9),  # the same model on an 80 GB card, 1,300-token chats
        (24 * GB, 28 * GB, 131072, 1024, 0.9),  # weights bigger than the card
        (
            pick.choice((40, 80, 141)) * GB,
            pick.choice((1, 16, 28)) * GB,
            pick.choice((61440, 131072, 163840)),
            pick.choice((2048, 4096, 32768)),
            pick.choice((0.8, 0.9, 0.95)),
        ),
    ]
    return (cases,)


def _fit_oracle(inputs) -> dict[str, list]:
    cases = inputs[0]
    right = [
        max(0, math.floor((memory * fraction - weights) / (per_token * context)))
        for memory, weights, per_token, context, fraction in cases
    ]
    return {"counts": right, "cases": [list(case) for case in cases]}


def _compare_fit(expected, got) -> Mismatch | None:
    if not isinstance(got, list) or len(got) != len(expected["counts"]):
        return Mismatch(f"expected a list of {len(expected['counts'])} counts, got {got!r}")
    for (memory, weights, per_token, context, fraction), want, have in zip(expected["cases"], expected["counts"], got):
        if have == want and isinstance(have, int):
            continue
        where = (
            f"{memory / GB:.0f} GB card at {fraction:.0%}, {weights / GB:.0f} GB of weights, "
            f"{per_token:,} bytes per token, {context:,}-token conversations: expected {want}, got {have!r}"
        )
        per_conversation = per_token * context
        hints = {
            max(0, math.floor((memory - weights) / per_conversation)): "Only memory_fraction of the card is "
            "usable: multiply the memory by it before subtracting the weights.",
            math.floor(memory * fraction / per_conversation): "Subtract the weights first: they take their share "
            "of the memory before any KV cache does.",
            math.ceil((memory * fraction - weights) / per_conversation): "Round down: a conversation that only "
            "partly fits does not fit.",
            math.floor((memory * fraction - weights) / per_conversation): "When the weights alone do not fit, "
            "no conversation does: the answer is 0, never negative.",
        }
        if isinstance(have, float) and have.is_integer() and int(have) == want:
            return Mismatch(where, "Return an int (a count of conversations), not a float.")
        return Mismatch(where, hints.get(have) if have != want else None)
    return None


register(
    Exercise(
        id="lab2.conversations_that_fit",
        functions=("conversations_that_fit",),
        make_inputs=_fit_inputs,
        run=lambda functions, inputs: [functions[0](*case) for case in inputs[0]],
        oracle=_fit_oracle,
        compare=_compare_fit,
        tested="conversations_that_fit(gpu_memory_bytes, weight_bytes, kv_bytes_per_token, context_tokens, "
        "memory_fraction) on four cards and models, one whose weights do not fit",
        hint="floor((memory x fraction - weights) / (KV bytes per token x context tokens)), and 0 if that is negative.",
    )
)

register_hints(
    "lab2.conversations_that_fit",
    "The engine may use only a fraction of the card. The weights take their share of that first, and what remains "
    "holds the KV caches, one per conversation.",
    "usable = memory x fraction; left for caches = usable - weights; one conversation needs KV bytes per token x "
    "context tokens; count only whole conversations, and never fewer than none.",
    "Floor division (//) counts whole conversations; max(0, ...) turns weights that do not fit into 0; return an int.",
)
