"""Lab 14, mixture of experts: its four exercises' checks (importing this package registers them), routing here and
the others a module each: the dispatch that groups tokens by expert, expert parallelism over two processes, and
the weight bytes a decode step reads. A wrong route is compared with the typical mistakes (:data:`MISTAKES`) so the
message names the one it shows; the course's own answers, the oracles, are in :mod:`~labkit.labs.lab14.course`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import on_check_device, rng, torch_generator
from labkit.labs.hints import register_hints
from labkit.labs.lab14.course import course_route

TOLERANCE = dict(atol=1e-5, rtol=1e-4)


def _renormalized(weights: torch.Tensor, chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return weights / weights.sum(dim=-1, keepdim=True), chosen


def _no_renormalization(logits, k):
    return torch.softmax(logits, dim=-1).topk(k, dim=-1)


def _softmax_over_tokens(logits, k):
    return _renormalized(*torch.softmax(logits, dim=0).topk(k, dim=-1))


def _lowest_k(logits, k):
    return _renormalized(*torch.softmax(logits, dim=-1).topk(k, dim=-1, largest=False))


def _raw_logits(logits, k):
    return logits.topk(k, dim=-1)


def _sigmoid_scores(logits, k):
    return _renormalized(*torch.sigmoid(logits).topk(k, dim=-1))


MISTAKES: dict[str, Callable[[torch.Tensor, int], Any]] = {
    "The weights were not renormalized: the k probabilities you kept sum to less than 1, so the layer's output "
    "shrinks by how much probability the other experts had. Divide them by their sum (Mixtral, and Qwen3 with "
    "norm_topk_prob, do).": _no_renormalization,
    "The softmax ran over the tokens (dim=0): each expert's column summed to 1. Logits are [tokens, experts]; the "
    "router's softmax is over the experts, dim=-1.": _softmax_over_tokens,
    "You kept the k LEAST likely experts: topk takes the largest by default (largest=True); sorting ascending and "
    "taking the first k gives the smallest.": _lowest_k,
    "The weights are the raw logits: they can be negative and do not sum to 1. Take the softmax first (or the "
    "softmax of the k chosen logits, which is the same).": _raw_logits,
    "You scored the experts with a sigmoid (DeepSeek-V3's affinities): this router, like Mixtral's and Qwen3's, "
    "takes a softmax over the experts.": _sigmoid_scores,
}


def route_cases(seed: int) -> list[dict[str, Any]]:
    """Seeded logits [T, E] for k = 1, 2 and 4, over 8 or 16 experts, 3 to 12 tokens each."""
    r, generator = rng(seed), torch_generator(seed)
    cases = []
    for k in (2, 1, 4):
        tokens, experts = r.randint(3, 12), r.choice([8, 16])
        cases.append({"logits": torch.randn(tokens, experts, generator=generator) * 2, "k": k})
    return on_check_device(cases)


def _canonical(answer: Any) -> dict[str, Any] | str:
    """The answer's (weights, chosen) with each token's pairs sorted by expert, so any order of the k passes."""
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2):
        return f"a {type(answer).__name__}: {answer!r:.60}"
    weights, chosen = answer
    if not (isinstance(weights, torch.Tensor) and isinstance(chosen, torch.Tensor)):
        return f"a pair of {type(weights).__name__} and {type(chosen).__name__}"
    if chosen.is_floating_point() and not weights.is_floating_point():
        return "(chosen, weights), in that order"
    if weights.shape != chosen.shape or weights.dim() != 2:
        return f"weights of shape {tuple(weights.shape)} and chosen of shape {tuple(chosen.shape)}"
    order = chosen.argsort(dim=-1)
    return {"weights": weights.float().gather(-1, order), "chosen": chosen.long().gather(-1, order)}


def _run(functions, cases):
    return [_canonical(functions[0](case["logits"], case["k"])) for case in cases]


def _oracle(cases) -> dict[str, Any]:
    def answers(function) -> list[Any]:
        return [_canonical(function(case["logits"], case["k"])) for case in cases]

    return {
        "right": answers(course_route),
        "wrong": {hint: answers(mistake) for hint, mistake in MISTAKES.items()},
        "shapes": [tuple(case["logits"].shape) for case in cases],
        "k": [case["k"] for case in cases],
    }


def _same(got: Any, expected: dict[str, Any]) -> bool:
    return (
        isinstance(got, dict)
        and got["chosen"].shape == expected["chosen"].shape
        and torch.equal(got["chosen"], expected["chosen"])
        and torch.allclose(got["weights"], expected["weights"], **TOLERANCE)
    )


def _compare(expected: dict[str, Any], got: list[Any]) -> Mismatch | None:
    for index, (answer, right) in enumerate(zip(got, expected["right"])):
        (tokens, experts), k = expected["shapes"][index], expected["k"][index]
        where = f"logits of {tokens} tokens over {experts} experts, k = {k}"
        if isinstance(answer, str):
            return Mismatch(f"{where}: route returned {answer}", "Return (weights, chosen), both [tokens, k].")
        if answer["chosen"].shape != right["chosen"].shape:
            return Mismatch(
                f"{where}: {answer['chosen'].shape[1]} experts per token, expected {k}",
                "Use the k you are given (topk(k, dim=-1)), not a number of your own.",
            )
        if _same(answer, right):
            continue
        hint = next((hint for hint, wrong in expected["wrong"].items() if _same(answer, wrong[index])), None)
        token = int(((answer["chosen"] != right["chosen"]).any(-1) | (answer["weights"] - right["weights"]).abs().gt(
            1e-4).any(-1)).nonzero()[0])  # fmt: skip
        said = ", ".join(f"{int(e)}: {float(w):.4f}" for e, w in zip(answer["chosen"][token], answer["weights"][token]))
        want = ", ".join(f"{int(e)}: {float(w):.4f}" for e, w in zip(right["chosen"][token], right["weights"][token]))
        return Mismatch(f"{where}, token {token}: expert: weight {{{said}}}, expected {{{want}}}", hint)
    return None


register(
    diagnosed(
        Exercise(
            id="lab14.route",
            functions=("route",),
            answers=("labkit.labs.lab14.course.course_route",),
            make_inputs=route_cases,
            run=_run,
            oracle=_oracle,
            compare=_compare,
            tested="route on seeded router logits of 3 to 12 tokens over 8 or 16 experts, at k = 2, 1 and 4: each "
            "token's k experts (in any order) and weights that are their softmax probabilities renormalized to sum "
            "to 1, within 1e-5",
            hint="softmax over the experts (dim=-1), topk(k), divide the k weights by their sum. "
            'labkit.hint("lab14.route") shows more.',
        )
    )
)

register_hints(
    "lab14.route",
    "A token's logits are one row, one number per expert. Turn the row into probabilities, keep the k most likely "
    "experts, and make their k weights sum to 1 again.",
    "probabilities = torch.softmax(logits, dim=-1); weights, chosen = probabilities.topk(k, dim=-1); then divide "
    "weights by weights.sum(dim=-1, keepdim=True).",
    "weights, chosen = torch.softmax(logits.float(), dim=-1).topk(k, dim=-1)\n"
    "return weights / weights.sum(dim=-1, keepdim=True), chosen",
)

# parts 2 to 4, registered after part 1 so the exercises number as the notebook shows them
from labkit.labs.lab14 import dispatch  # noqa: E402, F401, I001
from labkit.labs.lab14 import parallel  # noqa: E402, F401
from labkit.labs.lab14 import bytes_read  # noqa: E402, F401
