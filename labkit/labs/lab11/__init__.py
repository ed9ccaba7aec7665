"""Lab 11, the kernel: PagedAttention's decode step as a GPU runs it, written in Triton and checked on any CPU.

- ``paged_decode_kernel``: one program per (sequence, KV head) walks the block table, loads each block's
  keys and values where they lie, masks the last block's empty slots, and keeps a running softmax for the
  group of query heads that share the KV head. Checked under Triton's interpreter on seeded cases (random
  block tables, contexts that end mid-block, one and three query heads per KV head, scores large enough to
  overflow ``exp`` without the running max) against labkit's reference, and inside the engine.
- ``split_kv_kernel`` and ``merge_splits_kernel``: split-KV ("flash-decoding"): each split keeps its partial
  max, sum and weighted values; the merge brings them to one max. Checked with one, two and more splits
  than a sequence has blocks.
- ``decode_bytes``: the bytes one layer's decode step reads, kernel against gather-then-SDPA.

Each wrong answer is compared with the typical mistakes (simulated in :mod:`~labkit.labs.lab11.variants`)
so the message names the one it shows.
"""

from __future__ import annotations

from typing import Any

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.compare import compare_tensors
from labkit.grading.result import Mismatch, Note
from labkit.kernels.traffic import DecodeShape, decode_bytes
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.engine_runs import random_requests, serve
from labkit.labs.common.shared import rng, torch_generator
from labkit.labs.common.solo import compare_with_solo, run_failure, solo_oracle
from labkit.labs.hints import register_hints
from labkit.labs.lab11.variants import simulate

BLOCK_SIZE, HEAD_DIM, POOL_BLOCKS, TABLE_WIDTH = 16, 16, 24, 4
ATOL = RTOL = 1e-4

MISTAKES = {  # simulate()'s switch -> what the learner is told
    "rescale": (
        dict(rescale=False),
        "When a block raises the running max, the sum and the weighted values gathered so far were computed "
        "against the old max: multiply both by exp(old_max - new_max) before adding the new block's terms.",
    ),
    "max": (
        dict(subtract_max=False),
        "exp(score) overflowed: scores of a few hundred are beyond float32's range. Subtract the running max "
        "before exp (and rescale what you gathered whenever it grows).",
    ),
    "tail": (
        dict(mask_tail=False),
        "The last block's slots past the context were read as tokens: they hold whatever was there before. Mask "
        "positions >= context_len (in the loads, and set their scores to -inf).",
    ),
    "head": (
        dict(head_map="modulo"),
        "A query head read the wrong KV head: with GROUP query heads per KV head, query head h reads KV head "
        "h // GROUP (heads kv_head * GROUP ... kv_head * GROUP + GROUP - 1 share it), not h % NUM_KV_HEADS.",
    ),
    "table": (
        dict(use_table=False),
        "The block's position in the table was used as the block itself: the i-th block of a sequence is "
        "block_tables[seq, i], wherever it lies in the pool.",
    ),
    "merge": (
        dict(merge_rescaled=False),
        "The splits were added up as they are, but each split's sum and weighted values are relative to its "
        "own max: scale split s by exp(max_s - overall_max) before adding (an empty split counts 0).",
    ),
}


# --- seeded cases ---------------------------------------------------------------------------------------


def _case(seed: int, heads: int, kv_heads: int, lengths: list[int], q_scale: float = 1.0) -> dict[str, Any]:
    """Pools full of random values (so unmasked slots show), random block tables, contexts ending mid-block."""
    generator, r = torch_generator(seed), rng(seed)
    blocks = r.sample(range(POOL_BLOCKS), len(lengths) * TABLE_WIDTH)
    return {
        "q": q_scale * torch.randn(len(lengths), heads, HEAD_DIM, generator=generator),
        "k_pool": torch.randn(POOL_BLOCKS, BLOCK_SIZE, kv_heads, HEAD_DIM, generator=generator),
        "v_pool": torch.randn(POOL_BLOCKS, BLOCK_SIZE, kv_heads, HEAD_DIM, generator=generator),
        "block_tables": torch.tensor(blocks, dtype=torch.int32).view(len(lengths), TABLE_WIDTH),
        "context_lens": torch.tensor(lengths, dtype=torch.int32),
    }


def _mid_block(r, low: int, high: int) -> int:
    """A context length in [low, high] that does not fill its last block."""
    length = r.randint(low, high)
    return length - 1 if length % BLOCK_SIZE == 0 else length


def decode_cases(seed: int) -> dict[str, dict[str, Any]]:
    """Three cases: one query head per KV head, three, and scores large enough to overflow exp."""
    r = rng(seed)
    lengths = [_mid_block(r, 1, 15), _mid_block(r, 17, 47), _mid_block(r, 49, 63)]
    return {
        "one query head per KV head": _case(seed, 2, 2, lengths),
        "three query heads per KV head": _case(seed + 1, 6, 2, lengths[::-1]),
        "large scores (q x 60)": _case(seed + 2, 4, 2, lengths[1:], q_scale=60.0),
    }


def split_cases(seed: int) -> dict[str, dict[str, Any]]:
    """One split, two, and more splits than a sequence has blocks (empty splits), three query heads per KV head."""
    r = rng(seed)
    lengths = [_mid_block(r, 1, 15), _mid_block(r, 33, 63)]
    return {
        f"{splits} split{'s' if splits > 1 else ''}": {**_case(seed + splits, 6, 2, lengths), "num_splits": splits}
        for splits in (1, 2, 8)
    }


def _expected(cases: dict[str, dict[str, Any]], mistakes: tuple[str, ...]) -> dict[str, Any]:
    """Each case's right output and what each typical mistake would give."""
    tensors = ("q", "k_pool", "v_pool", "block_tables", "context_lens")
    expected = {}
    for name, case in cases.items():
        args = [case[key] for key in tensors]
        splits = case.get("num_splits", 1)
        expected[name] = {
            "out": simulate(*args, num_splits=splits),
            "wrong": {key: simulate(*args, num_splits=splits, **MISTAKES[key][0]) for key in mistakes},
        }
    return expected


def _compare_cases(expected: dict[str, Any], got: dict[str, Any]) -> Mismatch | Note | None:
    for name, want in expected.items():
        have = got.get(name) if isinstance(got, dict) else None
        mismatch = compare_tensors(
            want["out"], have, dims=("sequence", "query head", "dim"), what="attention output", atol=ATOL, rtol=RTOL
        )
        if mismatch is None:
            continue
        for key, wrong in want["wrong"].items():
            if isinstance(have, torch.Tensor) and have.shape == wrong.shape:
                if torch.allclose(have, wrong, atol=ATOL, rtol=RTOL, equal_nan=True):
                    return Mismatch(mismatch.difference, MISTAKES[key][1]).within(name)
        if isinstance(have, torch.Tensor) and not torch.isfinite(have).all():
            return Mismatch(mismatch.difference, MISTAKES["max"][1]).within(name)
        return mismatch.within(name)
    return None


# --- lab11.paged_decode -------------------------------------------------------------------------------

ENGINE = dict(max_num_seqs=4, num_blocks=48, block_size=BLOCK_SIZE)


def _run_decode(functions, inputs) -> dict[str, Any]:
    from labkit.kernels.paged_decode import decode_attention, launch_paged_decode

    kernel = functions[0]
    outs = {
        name: launch_paged_decode(kernel, *(case[k] for k in ("q", "k_pool", "v_pool", "block_tables", "context_lens")))
        for name, case in inputs["cases"].items()
    }

    def decode(q, k_pool, v_pool, block_tables, context_lens):
        return launch_paged_decode(kernel, q, k_pool, v_pool, block_tables, context_lens)

    engine = serve(inputs["requests"], "continuous", attention=decode_attention(decode), **ENGINE)
    return {"outs": outs, "engine": engine}


def _decode_oracle(inputs) -> dict[str, Any]:
    return {
        "outs": _expected(inputs["cases"], ("max", "rescale", "tail", "head", "table")),
        **solo_oracle({"requests": inputs["requests"]}),
    }


def _compare_decode(expected, got) -> Mismatch | Note | None:
    mismatch = _compare_cases(expected["outs"], got["outs"])
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
            make_inputs=lambda seed: {"cases": decode_cases(seed), "requests": random_requests(seed, 4)},
            run=_run_decode,
            oracle=_decode_oracle,
            compare=_compare_decode,
            tested="your kernel under Triton's interpreter on 3 seeded cases (pools of 24 blocks of 16, random block "
            "tables, contexts ending mid-block, 1 and 3 query heads per KV head, scores up to a few hundred) equals "
            "labkit's attention, and the engine with your kernel on its decode steps gives every request its solo tokens",
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


# --- lab11.split_kv -----------------------------------------------------------------------------------


def _run_split(functions, inputs) -> dict[str, Any]:
    from labkit.kernels.paged_decode import launch_split_kv

    split_kernel, merge_kernel = functions
    keys = ("q", "k_pool", "v_pool", "block_tables", "context_lens")
    return {
        name: launch_split_kv(split_kernel, merge_kernel, *(case[k] for k in keys), case["num_splits"])
        for name, case in inputs.items()
    }


register(
    diagnosed(
        Exercise(
            id="lab11.split_kv",
            functions=("split_kv_kernel", "merge_splits_kernel"),
            make_inputs=split_cases,
            run=_run_split,
            oracle=lambda cases: _expected(cases, ("merge", "rescale", "tail", "table")),
            compare=_compare_cases,
            tested="your split and merge kernels under Triton's interpreter with 1, 2 and 8 splits (more splits than "
            "a sequence has blocks, so some are empty) on seeded cases with 3 query heads per KV head equal labkit's "
            "attention",
            hint="Each split walks only its own run of blocks and stores its m, l and acc unnormalized; the merge finds "
            "the largest m over the splits and adds each split's l and acc times exp(m_s - largest). "
            'labkit.hint("lab11.split_kv") shows more.',
            points=2.0,
        )
    )
)

register_hints(
    "lab11.split_kv",
    "Split s of a sequence covers blocks s * blocks_per_split up to (s + 1) * blocks_per_split, but never past "
    "the sequence's last block: a split may have nothing to do, and then it stores m = -inf, l = 0, acc = 0. The "
    "merge must give such a split no weight.",
    "In the merge: overall = tl.max(maxes, axis=0); worth = exp(maxes - overall), 0 where maxes is -inf; then "
    "out = tl.sum(accs * worth[:, None], axis=0) / tl.sum(sums * worth, axis=0).",
)


# --- lab11.decode_bytes -------------------------------------------------------------------------------


def bytes_cases(seed: int) -> list[dict[str, Any]]:
    """The default model's shapes with seeded chat contexts, a Llama-8B-like batch, and one in float32."""
    r = rng(seed)
    chats = [r.randint(20, 900) for _ in range(6)]
    return [
        dict(context_lens=chats, block_size=16, num_heads=9, num_kv_heads=3, head_dim=64, dtype_bytes=2),
        dict(
            context_lens=[4096] * 7 + [r.randint(100, 4000)],
            block_size=16,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            dtype_bytes=2,
        ),
        dict(
            context_lens=[r.randint(1, 40) for _ in range(3)],
            block_size=8,
            num_heads=4,
            num_kv_heads=4,
            head_dim=16,
            dtype_bytes=4,
        ),
    ]


def _kernel(case: dict[str, Any], kv_heads_read: int | None = None, whole_blocks: bool = False) -> int:
    """The kernel's bytes for ``case``, or what a typical mistake counts: keys and values per query head
    (``kv_heads_read=num_heads``) or in whole blocks."""
    size, heads = case["block_size"], kv_heads_read or case["num_kv_heads"]
    total = 0
    for n in case["context_lens"]:
        blocks = -(-n // size)
        tokens = blocks * size if whole_blocks else n
        total += 2 * tokens * heads * case["head_dim"] * case["dtype_bytes"]
        total += case["num_heads"] * case["head_dim"] * case["dtype_bytes"] + case["num_kv_heads"] * (blocks + 1) * 4
    return total


def _gather(case: dict[str, Any], reads: int = 2, padded: bool = True) -> int:
    """The gather path's bytes read, or what a typical mistake counts: the copy read once, or no padding."""
    size, row = case["block_size"], 2 * case["num_kv_heads"] * case["head_dim"] * case["dtype_bytes"]
    width = max(-(-n // size) for n in case["context_lens"])
    queries = case["num_heads"] * case["head_dim"] * case["dtype_bytes"]
    blocks = [width if padded else -(-n // size) for n in case["context_lens"]]
    return sum(reads * b * size * row + width * 8 + queries for b in blocks)


BYTES_MISTAKES = {
    "The kernel's keys and values were counted per query head: the query heads of a group share one KV head, and "
    "the program loads it once for all of them (count num_kv_heads).": lambda c: {
        "kernel": _kernel(c, kv_heads_read=c["num_heads"])
    },
    "The kernel was counted in whole blocks: its masked loads read only the context_len slots that hold tokens "
    "(the gather copies whole blocks).": lambda c: {"kernel": _kernel(c, whole_blocks=True)},
    "The gather path's copy was counted once: index_select reads the blocks from the pool and SDPA reads the copy "
    "again, so the keys and values cross the memory bus twice (plus the write).": lambda c: {
        "gather": _gather(c, reads=1)
    },
    "The gather path was counted without padding: one SDPA call needs one width, so every sequence's table is "
    "padded to the longest and the padding is copied and read too.": lambda c: {"gather": _gather(c, padded=False)},
}


def _bytes_oracle(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    expected = []
    for case in cases:
        right = decode_bytes(DecodeShape(**case))
        right = {"kernel": right["kernel"], "gather": right["gather"]}
        expected.append(
            {"right": right, "wrong": {hint: {**right, **make(case)} for hint, make in BYTES_MISTAKES.items()}}
        )
    return expected


def _compare_bytes(expected: list[dict[str, Any]], got: list[Any]) -> Mismatch | None:
    for index, (want, have) in enumerate(zip(expected, got)):
        if not isinstance(have, dict) or not {"kernel", "gather"} <= set(have):
            return Mismatch(
                f"case {index}: decode_bytes returned {type(have).__name__} {have!r:.80}",
                "Return a dict with the two counts: {'kernel': ..., 'gather': ...} (whole numbers of bytes).",
            )
        have = {key: have[key] for key in ("kernel", "gather")}
        if have == want["right"]:
            continue
        key = "kernel" if have["kernel"] != want["right"]["kernel"] else "gather"
        difference = f"case {index}: {key} bytes: expected {want['right'][key]:,}, got {have[key]!r}"
        for hint, wrong in want["wrong"].items():
            if have[key] == wrong[key]:
                return Mismatch(difference, hint)
        return Mismatch(difference)
    return None


register(
    diagnosed(
        Exercise(
            id="lab11.decode_bytes",
            functions=("decode_bytes",),
            answers=("labkit.kernels.traffic.decode_bytes",),
            make_inputs=bytes_cases,
            run=lambda functions, cases: [functions[0](**case) for case in cases],
            oracle=_bytes_oracle,
            compare=_compare_bytes,
            tested="decode_bytes on 3 shapes (the default model with seeded chat contexts, an 8B-like batch of 4k "
            "contexts, one in float32 with 8-token blocks): the bytes the kernel and the gather path read, exactly",
            hint="The kernel reads each sequence's keys and values once per KV head, only the context's slots, plus "
            "its queries and, per (sequence, KV head) program, the table entries and the length (int32). The gather "
            'path reads padded whole blocks twice, int64 tables and the queries. labkit.hint("lab11.decode_bytes") '
            "shows more.",
        )
    )
)

register_hints(
    "lab11.decode_bytes",
    "Count per sequence, then add up. One token's keys for every KV head are num_kv_heads * head_dim * "
    "dtype_bytes bytes, and the values as many again.",
    "kernel = sum over sequences of 2 * n * num_kv_heads * head_dim * dtype_bytes + num_heads * head_dim * dtype_bytes "
    "+ num_kv_heads * (ceil(n / block_size) + 1) * 4. gather: width = the longest table in blocks; per sequence "
    "2 * (2 * width * block_size * num_kv_heads * head_dim * dtype_bytes) + width * 8 + num_heads * head_dim * dtype_bytes.",
)
