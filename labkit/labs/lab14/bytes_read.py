"""Lab 14, exercise 4: the weight bytes a decode step reads, from the experts its batch touched (each once per layer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.mistakes import named_mistake
from labkit.labs.common.shared import on_check_device, rng, torch_generator
from labkit.labs.hints import register_hints

EXPERTS = 8


def course_weight_bytes_per_step(chosen: list[torch.Tensor], expert_bytes: int, other_bytes: int) -> int:
    """``other_bytes`` plus, in each layer, one expert's bytes for each distinct expert its tokens chose."""
    return other_bytes + sum(len(layer.unique()) for layer in chosen) * expert_bytes


MISTAKES: dict[str, Callable[[list[torch.Tensor], int, int], int]] = {
    "You counted an expert once per token that chose it (tokens x k per layer): a step reads an expert's weights "
    "once, however many of its tokens chose it. Count the DISTINCT experts (chosen.unique()).": lambda chosen, e, o: (
        o + sum(layer.numel() for layer in chosen) * e
    ),
    "You counted every expert of every layer, as a dense model would: a step reads only the experts some token "
    "chose; count the distinct ids in each layer's routing.": lambda chosen, e, o: o + len(chosen) * EXPERTS * e,
    "You counted the distinct ids over all the layers together: expert 3 of layer 0 and expert 3 of layer 1 are "
    "different weights. Count each layer's distinct experts, then add the layers.": lambda chosen, e, o: (
        o + len(torch.cat([layer.flatten() for layer in chosen]).unique()) * e
    ),
    "Only the first layer's experts were counted: chosen holds one routing per MoE layer; add them all.": lambda chosen, e, o: (
        o + len(chosen[0].unique()) * e
    ),
    "other_bytes is missing: the attention, the routers and the embeddings are read every step too.": lambda chosen, e, o: (
        sum(len(layer.unique()) for layer in chosen) * e
    ),
}


def bytes_cases(seed: int) -> list[dict[str, Any]]:
    """Four routings over 8 experts, top-2: 1 token, a few, many, and a batch all on the same two experts."""
    r, generator = rng(seed), torch_generator(seed)
    cases = []
    for tokens, same in ((1, False), (r.randint(3, 6), False), (r.randint(20, 40), False), (r.randint(5, 9), True)):
        layers = []
        for _ in range(r.randint(2, 4)):
            scores = torch.rand(tokens, EXPERTS, generator=generator) ** 3  # uneven: some experts popular
            layers.append(torch.tensor([[0, 5]] * tokens) if same else scores.topk(2, dim=-1).indices)
        cases.append(
            {"chosen": layers, "expert_bytes": r.choice([3, 6]) * 2**20, "other_bytes": r.randint(1, 9) * 10**6}
        )
    return on_check_device(cases)


def _run(functions, cases) -> list[int | str]:
    results: list[int | str] = []
    for case in cases:
        got = functions[0](case["chosen"], case["expert_bytes"], case["other_bytes"])
        results.append(
            int(got) if isinstance(got, (int, torch.Tensor)) and not isinstance(got, bool) else repr(got)[:60]
        )
    return results


def _oracle(cases) -> dict[str, Any]:
    def answers(function) -> list[int]:
        return [int(function(c["chosen"], c["expert_bytes"], c["other_bytes"])) for c in cases]

    return {
        "right": answers(course_weight_bytes_per_step),
        "wrong": {hint: answers(mistake) for hint, mistake in MISTAKES.items()},
        "cases": [
            (len(c["chosen"][0]), len(c["chosen"]), [len(layer.unique()) for layer in c["chosen"]]) for c in cases
        ],
    }


def _compare(expected: dict[str, Any], got: list[int | str]) -> Mismatch | None:
    for index, (answer, right) in enumerate(zip(got, expected["right"])):
        tokens, layers, distinct = expected["cases"][index]
        where = (
            f"{tokens} token{'s' if tokens > 1 else ''} over {layers} layers (distinct experts per layer {distinct})"
        )
        if isinstance(answer, str):
            return Mismatch(f"{where}: weight_bytes_per_step returned {answer}", "Return a number of bytes (an int).")
        if answer != right:
            hint = named_mistake(expected["wrong"], got, index)
            return Mismatch(f"{where}: {answer:,} bytes, expected {right:,}", hint)
    return None


register(
    diagnosed(
        Exercise(
            id="lab14.bytes_per_step",
            functions=("weight_bytes_per_step",),
            answers=("labkit.labs.lab14.bytes_read.course_weight_bytes_per_step",),
            make_inputs=bytes_cases,
            run=_run,
            oracle=_oracle,
            compare=_compare,
            tested="weight_bytes_per_step on seeded top-2 routings over 8 experts (1 token, 3 to 6, 20 to 40, and 5 "
            "to 9 tokens all on the same two experts), 2 to 4 layers each: other_bytes plus one expert's bytes per "
            "distinct expert of each layer, exactly",
            hint="In each layer count the distinct experts (len(chosen[layer].unique())), add the layers, multiply by "
            'expert_bytes, add other_bytes. labkit.hint("lab14.bytes_per_step") shows more.',
        )
    )
)

register_hints(
    "lab14.bytes_per_step",
    "A step reads an expert's weights once if at least one token of the batch chose it, and not at all if none "
    "did. Each layer has its own experts.",
    "For each layer's routing, len(routing.unique()) is how many of its experts the step reads.",
    "return other_bytes + sum(len(layer.unique()) for layer in chosen) * expert_bytes",
)
