"""Lab 1, exercise 2: attention with grouped-query heads, checked against the math on random cases, a wrong output
named by the typical mistake it shows (``known_attention_mistakes``)."""

from __future__ import annotations

from typing import Any

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.compare import compare_sequences, compare_tensors
from labkit.grading.result import Mismatch
from labkit.kv.attention import attention, causal_mask
from labkit.labs.common.diagnose import ATTENTION_TOLERANCE, diagnosed, known_attention_mistakes
from labkit.labs.common.mistakes import tensor_mistake
from labkit.labs.common.shared import on_check_device, torch_generator
from labkit.labs.hints import register_hints


def _attention_inputs(seed: int) -> tuple[list[tuple[torch.Tensor, ...]]]:
    generator = torch_generator(seed)
    cases = []
    for num_queries, num_keys in ((5, 5), (1, 6), (3, 7)):
        q = torch.randn(num_queries, 4, 8, generator=generator)
        k = torch.randn(num_keys, 2, 8, generator=generator)
        v = torch.randn(num_keys, 2, 8, generator=generator)
        cases.append((q, k, v, causal_mask(num_queries, num_keys)))
    return on_check_device((cases,))


def _attention_oracle(inputs) -> dict[str, Any]:
    cases = inputs[0]
    return {
        "outs": [attention(*case) for case in cases],
        "mistakes": [known_attention_mistakes(q, k, v, k, v) for q, k, v, _ in cases],
    }


def _compare_attention(expected, got) -> Mismatch | None:
    if not isinstance(got, list) or len(got) != len(expected["outs"]):
        return compare_sequences(expected["outs"], got, lambda e, g: None, item="case")
    for index, (want, have) in enumerate(zip(expected["outs"], got)):
        mismatch = compare_tensors(
            want, have, dims=("query", "head", "dim"), what="attention output", **ATTENTION_TOLERANCE
        )
        if mismatch is None:
            continue
        hint = tensor_mistake(have, expected["mistakes"][index], **ATTENTION_TOLERANCE)
        mismatch = Mismatch(mismatch.difference, hint) if hint else mismatch
        return mismatch.within(f"case {index} ({want.shape[0]} queries, 4 query heads sharing 2 KV heads)")
    return None


ATTENTION = register(
    diagnosed(
        Exercise(
            id="lab1.attention",
            functions=("attention",),
            answers=("labkit.kv.attention.attention",),
            make_inputs=_attention_inputs,
            run=lambda functions, inputs: [functions[0](*case) for case in inputs[0]],
            oracle=_attention_oracle,
            compare=_compare_attention,
            tested="attention(q, k, v, mask) on 3 random cases (4 query heads, 2 KV heads, head_dim 8, "
            "5x5, 1x6 and 3x7 queries x keys) against softmax(q·kᵀ/√D + mask)·v",
            hint="Each group of Hq // Hkv query heads shares one KV head; scores are q·kᵀ / √D, forbidden keys get -inf "
            "before the softmax over the keys, and the weights mix the values back to [Tq, Hq, D]. "
            'labkit.hint("lab1.attention") shows more.',
        )
    )
)

register_hints(
    "lab1.attention",
    "Each query head scores every key it may see (q·k / √D), turns the scores into weights that sum to 1 (softmax, "
    "with forbidden keys at -inf so they get weight 0), and returns the weighted sum of the values. With "
    "grouped-query attention, several query heads read the same KV head.",
    "1. Give every query head its KV head: repeat each KV head Hq // Hkv times along the head axis, for k and v. "
    "2. Scores [Hq, Tq, Tk], divided by √D. 3. Where the mask is False, -inf. 4. Softmax over the keys (the last "
    "axis). 5. Weighted sum of the values, back to [Tq, Hq, D].",
    'k.repeat_interleave(Hq // Hkv, dim=1) (same for v); torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(D); '
    'scores.masked_fill(~mask, float("-inf")); torch.softmax(scores, dim=-1); '
    'torch.einsum("hqk,khd->qhd", weights, v).',
)
