"""Reading a recording of forward passes and saying what, if anything, went wrong, and where.

Each helper returns None when all is well, or a ``Mismatch`` whose text says where the learner's run first parts
from the right one (call, layer, position, head) and whose hint names the mistake when it looks like a known one;
``diagnosed(exercise)`` does the same for what the learner's code raised ("your function f raised X at line N")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from labkit.grading.checks import Exercise
from labkit.grading.compare import compare_tensors
from labkit.grading.result import Mismatch
from labkit.kv.attention import attention, causal_mask
from labkit.labs.common.learner_errors import capture, raised_in
from labkit.labs.common.mistakes import tensor_mistake

ATTENTION_TOLERANCE = dict(atol=1e-4, rtol=1e-4)
LOGITS_TOLERANCE = dict(atol=2e-3, rtol=1e-3)


def _scaled_by_one(q, k, v, mask):
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn_mask=mask,
        scale=1.0,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out.transpose(0, 1)


def _softmax_wrong(q, k, v, mask, masked_score: float = float("-inf"), dim: int = -1):
    """Attention with the masked scores set to ``masked_score`` and the softmax taken over ``dim``
    ([Hq, Tq, Tk] scores: -1 is over the keys, the right axis; -2 over the queries)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / q.shape[-1] ** 0.5
    weights = torch.softmax(scores.masked_fill(~mask, masked_score), dim=dim)
    return torch.einsum("hqk,khd->qhd", weights, v)


def _heads_tiled(q, k, v, mask):
    """Query head h paired with KV head h % Hkv (tiling) instead of h // group (blocks)."""
    repeats = q.shape[1] // k.shape[1]
    return attention(q, k.repeat(1, repeats, 1), v.repeat(1, repeats, 1), mask)


def known_attention_mistakes(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, new_keys: torch.Tensor, new_values: torch.Tensor
) -> dict[str, torch.Tensor]:
    """What a few typical wrong attention functions would return, keyed by the hint that names each."""
    tq, tk = q.shape[0], keys.shape[0]
    causal = causal_mask(tq, tk, q.device)
    mistakes = {
        "Your attention is not causal: a token also looks at tokens after it. Mask out keys j > i "
        "(a lower-triangular boolean mask, True where the query may look).": attention(q, keys, values, None),
        "Scores were not divided by sqrt(head_dim): softmax(q·kᵀ / √D) keeps the scores in a range "
        "where softmax is not almost one-hot.": _scaled_by_one(q, keys, values, causal),
        "The softmax runs over the queries: each key's weights sum to 1. It must run over the keys (the "
        "last axis of [Hq, Tq, Tk] scores), so that each query's weights sum to 1.": _softmax_wrong(
            q, keys, values, causal, dim=-2
        ),
        "Masked scores were set to 0, which still gets weight after the softmax (e^0 = 1). Set them to "
        "-inf: e^-inf = 0, so a hidden key gets no weight at all.": _softmax_wrong(q, keys, values, causal, 0.0),
    }
    if q.shape[1] != keys.shape[1]:
        mistakes[
            "Query heads are paired with the wrong KV heads. With grouped-query attention, query head h "
            "uses KV head h // (Hq / Hkv): use repeat_interleave, not repeat."
        ] = _heads_tiled(q, keys, values, causal)
    if tk > new_keys.shape[0]:
        mistakes[
            "Attention only sees the keys of this pass, not the cached ones: is the cache appended to "
            "(and is attention run over everything it holds)?"
        ] = attention(q, new_keys, new_values, causal_mask(tq, new_keys.shape[0], q.device))
    return mistakes


def check_attention(calls: Sequence[dict[str, Any]], keeps_history: bool) -> Mismatch | None:
    """Check every recorded layer's attention output against attention over what it should see.

    ``keeps_history``: with a KV cache a pass sees the keys of all earlier passes too; without
    one (every pass recomputes the whole sequence) it sees only its own.
    """
    history: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for call_index, call in enumerate(calls):
        for layer, record in enumerate(call["attention"]):
            q, k, v, out = record["q"], record["k"], record["v"], record["out"]
            keys, values = k, v
            if keeps_history and layer in history:
                keys, values = torch.cat([history[layer][0], k]), torch.cat([history[layer][1], v])
            history[layer] = (keys, values)
            expected = attention(q, keys, values, causal_mask(q.shape[0], keys.shape[0], q.device))
            mismatch = compare_tensors(
                expected, out, dims=("position", "head", "dim"), what="attention output", **ATTENTION_TOLERANCE
            )
            if mismatch is None:
                continue
            where = f"forward call {call_index}, layer {layer}"
            positions = call["positions"].tolist()
            detail = f"{where}: {mismatch.difference} (this pass holds positions {_span(positions)})"
            known = tensor_mistake(out, known_attention_mistakes(q, keys, values, k, v), **ATTENTION_TOLERANCE)
            return Mismatch(detail, known or mismatch.hint)
    return None


def _span(positions: list[int]) -> str:
    if len(positions) > 1 and positions == list(range(positions[0], positions[0] + len(positions))):
        return f"{positions[0]}..{positions[-1]}"
    return str(positions)


def check_positions(got: torch.Tensor, expected: list[int], where: str) -> Mismatch | None:
    """Positions of one pass against the right ones, naming an off-by-one when it is one."""
    got_list = [int(p) for p in got.tolist()]
    if got_list == expected:
        return None
    if len(got_list) != len(expected):
        return Mismatch(
            f"{where}: {len(got_list)} positions for {len(expected)} tokens",
            "Give every token in the pass exactly one position.",
        )
    first = next(i for i, (g, e) in enumerate(zip(got_list, expected)) if g != e)
    offsets = {g - e for g, e in zip(got_list, expected)}
    hint = "A token's position is its index in its own sequence: the first token of a sequence is at 0."
    if len(offsets) == 1:
        shift = offsets.pop()
        hint = (
            f"Every position is off by {shift:+d}. "
            + hint
            + (
                " With a cache, the new token's position is the number of tokens already cached."
                if expected[0] > 0
                else ""
            )
        )
    return Mismatch(f"{where}, token {first}: position expected {expected[first]}, got {got_list[first]}", hint)


def check_logits(expected: torch.Tensor, got: torch.Tensor, what: str) -> Mismatch | None:
    """Logits against the oracle's with the tolerance fp32 reordering needs."""
    return compare_tensors(
        expected, got, what=what, **LOGITS_TOLERANCE, dims=("position", "vocab") if expected.dim() == 2 else ("vocab",)
    )


def prompt_returned(prompt: list[int], tokens: Any, steps: int) -> Mismatch | None:
    """A decoding that returned the prompt and then its ``steps`` new tokens (labs 1 and 2)."""
    if isinstance(tokens, list) and len(tokens) == len(prompt) + steps and tokens[: len(prompt)] == prompt:
        return Mismatch(
            f"you returned {len(tokens)} tokens: the prompt's {len(prompt)} and then the {steps} new ones",
            "Return only the new tokens (the caller already has the prompt).",
        )
    return None


def raised_mismatch(record: dict[str, Any], hint: str | None) -> Mismatch:
    """The one-line report of an exception, pointing at the learner's own line when there is one."""
    what = f"{record['error']}: {record['message']}".rstrip(": ")
    if not record["function"]:
        return Mismatch(f"your code raised {what}", hint)
    code = f" (`{record['code']}`)" if record["code"] else ""
    return Mismatch(
        f"your function {record['function']} raised {what} at line {record['line']} of your cell{code}", hint
    )


def diagnosed(exercise: Exercise, known: Callable[[dict[str, Any]], str | None] | None = None) -> Exercise:
    """The exercise with the learner's exceptions caught in ``run`` (in the kernel, as a plain record) and reported by
    ``compare``, with the hint ``known(record)`` gives when the error shows a typical mistake."""
    run, compare = exercise.run, exercise.compare

    def judged(expected, got):
        record = raised_in(got)
        if record is not None:
            return raised_mismatch(record, known(record) if known else None)
        return compare(expected, got)

    return dataclasses.replace(
        exercise, run=lambda functions, inputs: capture(functions, lambda: run(functions, inputs)), compare=judged
    )
