"""Lab 14, exercise 2: the dispatch that groups tokens by expert, one call of each expert on all its tokens; the calls
are counted by the ``expert`` the check hands in, so a right output made one token at a time is named."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import on_check_device, rng, torch_generator
from labkit.labs.hints import register_hints
from labkit.labs.lab14.course import course_dispatch, course_route
from labkit.labs.lab14.moe_model import MoeLayer, make_layer, per_token_reference

TOLERANCE = dict(atol=1e-5, rtol=1e-4)

MISTAKES: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], torch.Tensor]] = {
    "The routing weights were not applied: each expert's output was added as it is. Multiply each token's rows "
    "by its weight for that expert before adding them up.": lambda x, w, c, expert: course_dispatch(
        x, torch.ones_like(w), c, expert
    ),
    "The routing weights were applied twice (once to the expert's input rows, once to its output, or squared): "
    "scale each expert's output by the token's weight once.": lambda x, w, c, expert: course_dispatch(
        x, w * w, c, expert
    ),
    "Each token got only its first expert: a token routed to k experts sends its row to each of them, k pairs "
    "(token, expert) per token; loop over chosen's every column, or flatten it.": lambda x, w, c, expert: (
        course_dispatch(x, w[:, :1], c[:, :1], expert)
    ),
}


def dispatch_cases(seed: int) -> list[dict[str, Any]]:
    """A seeded layer and three batches: 1 token, 9 to 16 tokens routed by the router, and 6 to 10 tokens all
    routed to the same two experts (the other six get none)."""
    r, generator = rng(seed), torch_generator(seed)
    layer = make_layer(seed)
    cases = []
    for tokens, skewed in ((1, False), (r.randint(9, 16), False), (r.randint(6, 10), True)):
        x = torch.randn(tokens, 64, generator=generator)
        weights, chosen = course_route(layer.logits(x), layer.top_k)
        if skewed:
            pair = torch.tensor(r.sample(range(layer.experts), 2))
            chosen = pair.repeat(tokens, 1)
        cases.append({"x": x, "weights": weights, "chosen": chosen})
    return on_check_device({"layer": layer, "cases": cases})


def _run(functions, inputs) -> list[dict[str, Any]]:
    """The learner's output for each case, with each call of an expert: (expert, rows)."""
    layer: MoeLayer = inputs["layer"]
    results = []
    for case in inputs["cases"]:
        calls: list[tuple[int, int]] = []

        def expert(e, rows, calls=calls):
            calls.append((int(e), len(rows)))
            return layer.expert(int(e), rows)

        out = functions[0](case["x"], case["weights"], case["chosen"], expert)
        results.append({"out": out if isinstance(out, torch.Tensor) else repr(out)[:80], "calls": calls})
    return results


def _oracle(inputs) -> dict[str, Any]:
    layer = inputs["layer"]
    cases = inputs["cases"]
    return {
        "right": [per_token_reference(c["x"], c["weights"], c["chosen"], layer.expert) for c in cases],
        "wrong": {
            hint: [mistake(c["x"], c["weights"], c["chosen"], layer.expert) for c in cases]
            for hint, mistake in MISTAKES.items()
        },
        "pairs": [(len(c["x"]), c["chosen"].shape[1], len(c["chosen"].unique())) for c in cases],
    }


def rows_elsewhere(got: torch.Tensor, right: torch.Tensor) -> list[tuple[int, int]]:
    """(token, token whose right output it holds) for each row of ``got`` that is another token's row."""
    moved = []
    for t, row in enumerate(got):
        if not torch.allclose(row, right[t], **TOLERANCE):
            match = next((u for u in range(len(right)) if torch.allclose(row, right[u], **TOLERANCE)), None)
            if match is not None:
                moved.append((t, match))
    return moved


def _value_mismatch(where: str, got: torch.Tensor, right: torch.Tensor, wrong: dict, index: int) -> Mismatch:
    hint = next((hint for hint, outputs in wrong.items() if torch.allclose(got, outputs[index], **TOLERANCE)), None)
    moved = rows_elsewhere(got, right)
    if hint is None and moved:
        hint = (
            "Rows went back to the wrong tokens: an expert's output rows come in the order of the rows you handed "
            "it; add each to the token it came from (out.index_add_(0, tokens, ...) with the same tokens you "
            "gathered x[tokens] with)."
        )
    hint = hint or (
        "Check that each expert's output rows go back to the tokens whose rows you handed it (the same index you "
        "gathered x with), each scaled by that token's weight for that expert."
    )
    token = int((got - right).abs().amax(dim=-1).argmax())
    said = f"; token {moved[0][0]} holds token {moved[0][1]}'s output" if moved else ""
    gap = float((got[token] - right[token]).abs().max())
    return Mismatch(f"{where}: token {token}'s output is off by up to {gap:.3g}{said}", hint)


def _calls_mismatch(where: str, calls: list[tuple[int, int]], pairs: int) -> Mismatch | None:
    busy = Counter(e for e, rows in calls if rows)
    again = sorted(e for e, count in busy.items() if count > 1)
    if again:
        return Mismatch(
            f"{where}: the output is right, but expert {again[0]} was called {busy[again[0]]} times "
            f"({len(calls)} calls in all)",
            "Call each expert once, on all the tokens routed to it: a call per token reads the expert's weights "
            "once per token, which is what the grouping saves.",
        )
    if sum(rows for _, rows in calls) != pairs:
        return Mismatch(f"{where}: the experts were handed {sum(r for _, r in calls)} rows for {pairs} (token, "
                        "expert) pairs", "Hand each expert exactly the rows of the tokens routed to it.")  # fmt: skip
    return None


def _compare(expected: dict[str, Any], got: list[dict[str, Any]]) -> Mismatch | None:
    for index, (result, right) in enumerate(zip(got, expected["right"])):
        tokens, k, used = expected["pairs"][index]
        where = f"{tokens} token{'s' if tokens > 1 else ''}, k = {k}, {used} experts chosen"
        out = result["out"]
        if not isinstance(out, torch.Tensor):
            return Mismatch(f"{where}: moe_dispatch returned {out}", "Return the layer's output, a tensor [T, H].")
        if out.shape != right.shape:
            return Mismatch(
                f"{where}: the output has shape {tuple(out.shape)}, expected {tuple(right.shape)}",
                "One output row per token: add each (token, expert) pair's weighted row into its token's row.",
            )
        if not torch.allclose(out, right, **TOLERANCE):
            return _value_mismatch(where, out, right, expected["wrong"], index)
        mismatch = _calls_mismatch(where, result["calls"], tokens * k)
        if mismatch is not None:
            return mismatch
    return None


def _empty_expert(record: dict[str, Any]) -> str | None:
    words = ("empty", "0 elements", "size 0", "non-empty", "zero")
    if any(word in record["message"] for word in words):
        return (
            "Did an expert that no token chose reach your code? The first case has one token, so 6 of 8 experts "
            "get no rows: skip them (loop over chosen.unique(), or skip empty groups)."
        )
    return None


register(
    diagnosed(
        Exercise(
            id="lab14.dispatch",
            functions=("moe_dispatch",),
            answers=("labkit.labs.lab14.course.course_dispatch",),
            make_inputs=dispatch_cases,
            run=_run,
            oracle=_oracle,
            compare=_compare,
            tested="moe_dispatch on a seeded layer (8 SwiGLU experts, top-2) with 1 token, 9 to 16 tokens, and 6 to "
            "10 tokens all routed to the same two experts: the output within 1e-5 of the layer computed token by "
            "token, each expert called at most once, and exactly one row per (token, expert) pair",
            hint="For each expert that some token chose: gather those tokens' rows, call the expert once, scale the "
            'rows by their weights and add them back to their tokens. labkit.hint("lab14.dispatch") shows more.',
        ),
        known=_empty_expert,
    )
)

register_hints(
    "lab14.dispatch",
    "Flatten the routing into (token, expert, weight) triples, k per token. Then, for each expert that appears, "
    "take all its triples at once: their tokens' rows go through the expert in one call.",
    "token = torch.arange(T).repeat_interleave(k); flat = chosen.flatten(); for e in flat.unique(): picks = (flat == "
    "e).nonzero().flatten(); rows = token[picks]; then expert(e, x[rows]) scaled by weights.flatten()[picks].",
    "out = torch.zeros_like(x)\nfor e in flat.unique().tolist():\n    picks = (flat == e).nonzero().flatten()\n"
    "    out.index_add_(0, token[picks], weights.flatten()[picks, None] * expert(e, x[token[picks]]))\nreturn out",
)
