"""Lab 5, exercise 3: one sequence's attention through its block table, against dense attention (the typical
mistakes named), then plugged into the engine (:func:`engine_attention`)."""

from __future__ import annotations

from typing import Any

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.compare import compare_tensors
from labkit.grading.result import Mismatch
from labkit.kv.attention import attention, causal_mask
from labkit.kv.paged_batch import PagedBatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.engine_runs import random_requests, serve
from labkit.labs.common.mistakes import tensor_mistake
from labkit.labs.common.shared import on_check_device, rng, torch_generator
from labkit.labs.common.solo import compare_with_solo, run_failure, solo_oracle
from labkit.labs.hints import register_hints


def _attention_cases(seed: int) -> list[dict[str, torch.Tensor | list[int] | int]]:
    """Pools of 12 blocks of 4 with random contents; tables in random order; queries at the end of the context."""
    generator = torch_generator(seed)
    r = rng(seed)
    cases = []
    for context_len, num_query in ((1, 1), (13, 1), (23, 5), (16, 16)):
        k_pool = torch.randn(12, 4, 2, 8, generator=generator)
        v_pool = torch.randn(12, 4, 2, 8, generator=generator)
        table = r.sample(range(12), -(-context_len // 4))
        q = torch.randn(num_query, 4, 8, generator=generator)
        cases.append({"q": q, "k_pool": k_pool, "v_pool": v_pool, "block_table": table, "context_len": context_len})
    return on_check_device(cases)


def _dense(case, table=None, truncate=True, causal=True):
    table = case["block_table"] if table is None else table
    keys = case["k_pool"][table].flatten(0, 1)
    values = case["v_pool"][table].flatten(0, 1)
    if truncate:
        keys, values = keys[: case["context_len"]], values[: case["context_len"]]
    num_query = case["q"].shape[0]
    mask = causal_mask(num_query, keys.shape[0], keys.device) if causal else None
    return attention(case["q"], keys, values, mask)


def _attention_oracle(inputs) -> dict[str, Any]:
    cases, requests = inputs["cases"], inputs["requests"]
    mistakes = []
    for case in cases:
        known = {
            "The blocks were gathered in sorted order, not in block-table order: the table's i-th entry "
            "holds the sequence's tokens i*B..(i+1)*B-1, wherever that block sits in the pool.": _dense(
                case, sorted(case["block_table"])
            ),
            "The keys include the unused slots at the end of the last block: keep only the first context_len "
            "gathered tokens.": _dense(case, truncate=False, causal=False),
            "The queries are not masked causally: query i (at position context_len - Tq + i) may only see "
            "keys up to its own position (causal_mask(Tq, context_len, q.device)).": _dense(case, causal=False),
        }
        mistakes.append(known)
    return {"outs": [_dense(case) for case in cases], "mistakes": mistakes, **solo_oracle({"requests": requests})}


def _run_attention(functions, inputs) -> dict[str, Any]:
    learner = functions[0]
    outs = [
        learner(case["q"], case["k_pool"], case["v_pool"], case["block_table"], case["context_len"])
        for case in inputs["cases"]
    ]
    engine = serve(
        inputs["requests"],
        "continuous",
        attention=engine_attention(learner),
        max_num_seqs=4,
        num_blocks=48,
        block_size=4,
    )
    return {"outs": outs, "engine": engine}


def engine_attention(per_sequence):
    """Plug a one-sequence ``paged_attention(q, k_pool, v_pool, table, context_len)`` into the engine."""

    def attend(layer: int, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: PagedBatch):
        out = torch.empty_like(q)
        for seq in batch.sequences:
            rows = slice(seq.start, seq.start + seq.num_query)
            out[rows] = per_sequence(q[rows], k_pool, v_pool, seq.block_table, seq.context_len)
        return out

    return attend


def _compare_attention(expected, got) -> Mismatch | None:
    for index, (want, have, mistakes) in enumerate(zip(expected["outs"], got["outs"], expected["mistakes"])):
        mismatch = compare_tensors(
            want, have, dims=("query", "head", "dim"), what="attention output", atol=1e-4, rtol=1e-4
        )
        if mismatch is None:
            continue
        hint = tensor_mistake(have, mistakes, atol=1e-4)
        mismatch = Mismatch(mismatch.difference, hint) if hint else mismatch
        return mismatch.within(f"case {index} ({want.shape[0]} queries)")
    failure = run_failure(got["engine"], "in the engine with your attention, ")
    if failure is not None:
        return failure
    mismatch = compare_with_solo(expected["solo"], got["engine"]["tokens"])
    return mismatch.within("in the engine with your attention") if mismatch else None


def _attention_error_hint(record: dict[str, Any]) -> str | None:
    """A size error means the gathered keys and the mask disagree about how many tokens there are."""
    if "size" in record["message"]:
        return (
            "The keys and the mask disagree in length. The gathered blocks hold blocks x block_size slots, but only "
            "the first context_len of them are the sequence's tokens: cut keys and values to context_len, and mask "
            "with Tq rows and context_len columns."
        )
    return None


register(
    diagnosed(
        Exercise(
            id="lab5.paged_attention",
            functions=("paged_attention",),
            answers=("labkit.kv.paged_attention.paged_attention",),
            make_inputs=lambda seed: {"cases": _attention_cases(seed), "requests": random_requests(seed, 6)},
            run=_run_attention,
            oracle=_attention_oracle,
            compare=_compare_attention,
            tested="paged_attention on 4 seeded cases (pools of 12 blocks of 4, tables in random order; 1 to 16 queries) "
            "equals dense attention over the same keys, and the engine using it gives every request its solo tokens",
            hint="Gather the sequence's blocks in table order into one run of slots, keep only its context_len tokens, "
            "and mask so that each of the last Tq positions sees the keys up to itself. "
            'labkit.hint("lab5.paged_attention") shows more.',
            points=2.0,
        ),
        known=_attention_error_hint,
    )
)

register_hints(
    "lab5.paged_attention",
    "The sequence's keys lie in blocks scattered over the pool; its block table lists them in order. Gathered in "
    "table order they are exactly a dense cache, followed by the unused slots of the last block.",
    "Index the pools with the table ([blocks, block_size, Hkv, D]), flatten the first two axes, keep the first "
    "context_len rows; the Tq queries are the last Tq positions, so the mask has Tq rows and context_len columns.",
    "blocks = torch.tensor(block_table, device=k_pool.device); keys = k_pool[blocks].flatten(0, 1)[:context_len], "
    "the same for values; attention(q, keys, values, causal_mask(q.shape[0], context_len, q.device)).",
)
