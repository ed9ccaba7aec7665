"""Lab 11, exercise 1: ``paged_decode_kernel``, PagedAttention's decode step in Triton, checked under Triton's
interpreter on seeded cases (:mod:`~labkit.labs.lab11.kernel_cases`), then inside the engine."""

from __future__ import annotations

import functools
from typing import Any

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch, Note
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.engine_runs import random_requests, serve
from labkit.labs.common.solo import compare_with_solo, run_failure, solo_oracle
from labkit.labs.hints import register_hints
from labkit.labs.lab11.compiled import kernel_rule
from labkit.labs.lab11.kernel_cases import ATOL, BLOCK_SIZE, RTOL, compare_cases, decode_cases, expected_outputs

ENGINE = dict(max_num_seqs=4, num_blocks=48, block_size=BLOCK_SIZE)
# Four requests of 12 to 24 tokens arriving within 10 ticks, each decoding 1 to 7 tokens: decode steps of 3 or 4
# sequences whose contexts cross a block boundary, in a short run (each decode step runs the kernel interpreted).
REQUESTS: dict[str, Any] = dict(count=4, prompt_range=(12, 24), output_range=(2, 8), arrival_span=10)
CASES = ("q", "k_pool", "v_pool", "block_tables", "context_lens")


def _run_decode(functions, inputs) -> dict[str, Any]:
    from labkit.kernels.paged_decode import decode_attention, launch_paged_decode, reference_decode

    kernel = functions[0]
    outs = {name: launch_paged_decode(kernel, *(case[k] for k in CASES)) for name, case in inputs["cases"].items()}
    # twice what the comparison allows off labkit's reference: the cases fail this kernel, and say why, unserved
    if not all(
        torch.allclose(out, reference_decode(*(case[k] for k in CASES)), atol=2 * ATOL, rtol=2 * RTOL)
        for out, case in zip(outs.values(), inputs["cases"].values())
    ):
        return {"outs": outs, "engine": None}

    decode = functools.partial(launch_paged_decode, kernel)
    engine = serve(inputs["requests"], "continuous", attention=decode_attention(decode), **ENGINE)
    return {"outs": outs, "engine": engine}


def _decode_oracle(inputs) -> dict[str, Any]:
    return {
        "outs": expected_outputs(inputs["cases"], ("max", "block_max", "rescale", "tail", "head", "table")),
        **solo_oracle({"requests": inputs["requests"]}),
    }


def _compare_decode(expected, got) -> Mismatch | Note | None:
    mismatch = compare_cases(expected["outs"], got["outs"])
    if mismatch is not None:
        return mismatch
    failure = run_failure(got["engine"], "in the engine with your kernel, ")
    if failure is not None:
        return failure
    mismatch = compare_with_solo(expected["solo"], got["engine"]["tokens"])
    return mismatch.within("in the engine with your kernel on its decode steps") if mismatch else None


register(
    diagnosed(
        Exercise(
            id="lab11.paged_decode",
            functions=("paged_decode_kernel",),
            make_inputs=lambda seed: {"cases": decode_cases(seed), "requests": random_requests(seed, **REQUESTS)},
            run=_run_decode,
            oracle=_decode_oracle,
            compare=_compare_decode,
            source_rule=kernel_rule(("paged_decode_kernel",)),
            tested="your kernel cell holds Triton kernels only and compiles for an H100 (sm_90); under Triton's "
            "interpreter, on 5 seeded cases (pools of 24 blocks of 16, random block tables, contexts ending mid-block, "
            "1, 2 and 3 query heads per KV head, scores up to a few hundred, a first block scoring far above the rest, "
            "bf16 pools), it equals labkit's attention within 2e-3 (what TF32 on a GPU allows), and the engine with "
            "your kernel on its decode steps gives every request its solo tokens",
            hint="Per block: load the keys and values of this KV head at block_tables[seq, i], mask positions past the "
            "context, score the group's queries, raise the running max, rescale the sum and the accumulator, add "
            'the block. labkit.hint("lab11.paged_decode") shows more.',
            points=2.0,
        )
    )
)

register_hints(
    "lab11.paged_decode",
    "One program reads one sequence's context for one KV head, one block at a time, and never holds all the "
    "scores: it keeps, per query head, the largest score so far (m), the sum of exp(score - m) (l) and the "
    "exp-weighted sum of values (acc). At the end the answer is acc / l.",
    "For block i: block = tl.load(block_tables_ptr + seq * max_blocks_per_seq + i); the slots are "
    "tl.arange(0, BLOCK_SIZE), visible where i * BLOCK_SIZE + slot < context_len; the element (block, slot, "
    "kv_head, d) is at ((block * BLOCK_SIZE + slot) * NUM_KV_HEADS + kv_head) * HEAD_DIM + d. Load keys and values "
    "with mask=visible[:, None], scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale, and set the "
    "invisible ones to -inf.",
    "new_m = tl.maximum(m, tl.max(scores, axis=1)); alpha = tl.exp(m - new_m); p = tl.exp(scores - new_m[:, None]); "
    "l = l * alpha + tl.sum(p, axis=1); acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1); "
    "m = new_m. Start m at -inf (tl.zeros([GROUP_PAD], dtype=tl.float32) - float('inf')), l and acc at 0.",
)
