"""Lab 11, the kernel: PagedAttention's decode step as a GPU runs it, written in Triton and checked on any CPU.

- ``paged_decode_kernel``: one program per (sequence, KV head) walks the block table, loads each block's
  keys and values where they lie, masks the last block's empty slots, and keeps a running softmax for the
  group of query heads that share the KV head. Checked under Triton's interpreter on seeded cases (random
  block tables, contexts that end mid-block, one to three query heads per KV head, scores large enough to
  overflow ``exp`` without the running max, a first block far above the rest, bf16 pools) against labkit's
  reference, and inside the engine.
- ``split_kv_kernel`` and ``merge_splits_kernel``: split-KV ("flash-decoding"): each split keeps its partial
  max, sum and weighted values; the merge brings them to one max. Checked with one, three and five splits
  (not powers of two, some empty), large scores and bf16.

Both kernel checks grade kernels, not only outputs: the exercise cell's source, read as data, must hold Triton
kernels only, and they must compile for an H100 (:mod:`~labkit.labs.lab11.compiled`).
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
from labkit.kernels.contract import UNWRITTEN
from labkit.kernels.traffic import DecodeShape, decode_bytes
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.engine_runs import random_requests, serve
from labkit.labs.common.shared import on_check_device, rng, torch_generator
from labkit.labs.common.solo import compare_with_solo, run_failure, solo_oracle
from labkit.labs.hints import register_hints
from labkit.labs.lab11.compiled import kernel_rule
from labkit.labs.lab11.variants import simulate

BLOCK_SIZE, HEAD_DIM, POOL_BLOCKS, TABLE_WIDTH = 16, 16, 24, 4
# What a right kernel may differ by on a GPU too: fp32 tl.dot is TF32 there (2e-4 to 5e-4 at these shapes). An
# accumulator kept in bf16 is off by 4e-3 and more on the bf16 pools' case, whose queries and output stay fp32 (a
# bf16 output would hide it in its own rounding, which Triton's interpreter truncates where a GPU rounds).
ATOL = RTOL = 2e-3
BF16_HINT = (
    "Only the bf16 pools' case is off: keep m, l and acc in float32 (tl.zeros(..., dtype=tl.float32)) and load "
    "keys and values .to(tl.float32): a sum kept in bf16 loses all but 8 bits at every block."
)
OVERFLOWS = 80.0  # scores past this overflow exp in float32 (88.7) once a few are added: below it, a NaN is no overflow

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
    "block_max": (
        dict(block_max=True),
        "Each block's scores were taken against that block's own max, not the running one: after a block of high "
        "scores, a lower block makes exp(old_max - block_max) overflow. new_max = tl.maximum(running_max, the "
        "block's max).",
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
    "merge_max": (
        dict(merge_shifted=False),
        "The merge weighted each split by exp(max_s): split maxes in the hundreds overflow float32. Subtract the "
        "overall max first: exp(max_s - overall_max).",
    ),
}


# --- seeded cases ---------------------------------------------------------------------------------------


def _case(
    seed: int, heads: int, kv_heads: int, lengths: list[int], q_scale: float = 1.0, dtype=torch.float32
) -> dict[str, Any]:
    """Pools full of random values (so unmasked slots show) in ``dtype``, random block tables, contexts ending
    mid-block; queries in fp32."""
    generator, r = torch_generator(seed), rng(seed)
    blocks = r.sample(range(POOL_BLOCKS), len(lengths) * TABLE_WIDTH)
    case = {
        "q": q_scale * torch.randn(len(lengths), heads, HEAD_DIM, generator=generator),
        "k_pool": torch.randn(POOL_BLOCKS, BLOCK_SIZE, kv_heads, HEAD_DIM, generator=generator),
        "v_pool": torch.randn(POOL_BLOCKS, BLOCK_SIZE, kv_heads, HEAD_DIM, generator=generator),
        "block_tables": torch.tensor(blocks, dtype=torch.int32).view(len(lengths), TABLE_WIDTH),
        "context_lens": torch.tensor(lengths, dtype=torch.int32),
    }
    for key in ("k_pool", "v_pool"):
        case[key] = case[key].to(dtype)
    return case


def _loud_first_block(seed: int, lengths: list[int]) -> dict[str, Any]:
    """Queries and each sequence's first block's keys all positive and large (scores of about 150), the later
    blocks' scores small: after the first block every block's own max lies far below the running max, under
    every seed, so a running max replaced by the block's own overflows exp(old - new)."""
    case = _case(seed, 4, 2, lengths)
    case["q"] = case["q"].abs()
    first = case["block_tables"][:, 0].long()
    case["k_pool"][first] = 60 * case["k_pool"][first].abs()
    return case


def _mid_block(r, low: int, high: int) -> int:
    """A context length in [low, high] that does not fill its last block."""
    length = r.randint(low, high)
    return length - 1 if length % BLOCK_SIZE == 0 else length


def decode_cases(seed: int) -> dict[str, dict[str, Any]]:
    """One query head per KV head, three, two with scores large enough to overflow exp, a first block far above
    the rest, and bf16 pools; drawn on the CPU, handed over on the check's device, where the kernel runs."""
    r = rng(seed)
    lengths = [_mid_block(r, 1, 15), _mid_block(r, 17, 47), _mid_block(r, 49, 63)]
    return on_check_device(
        {
            "one query head per KV head": _case(seed, 2, 2, lengths),
            "three query heads per KV head": _case(seed + 1, 6, 2, lengths[::-1]),
            "large scores (q x 60)": _case(seed + 2, 4, 2, lengths[1:], q_scale=60.0),
            "a first block scoring far above the rest": _loud_first_block(seed + 3, lengths),
            "bf16 pools": _case(seed + 4, 6, 2, lengths, dtype=torch.bfloat16),
        }
    )


def split_cases(seed: int) -> dict[str, dict[str, Any]]:
    """One split, three and five (not powers of two, and more than a short sequence's blocks: empty splits),
    large scores, and bf16; three query heads per KV head."""
    r = rng(seed)
    lengths = [_mid_block(r, 1, 15), _mid_block(r, 33, 63)]
    cases = {
        f"{splits} split{'s' if splits > 1 else ''}": {**_case(seed + splits, 6, 2, lengths), "num_splits": splits}
        for splits in (1, 3, 5)
    }
    cases["large scores (q x 60), 3 splits"] = {**_case(seed + 7, 6, 2, lengths, q_scale=60.0), "num_splits": 3}
    cases["bf16 pools, 3 splits"] = {**_case(seed + 8, 6, 2, lengths, dtype=torch.bfloat16), "num_splits": 3}
    return on_check_device(cases)


def _max_score(case: dict[str, Any]) -> float:
    """The largest |score| a query meets in the case's pools: whether exp could overflow at all."""
    q, k = case["q"].double(), case["k_pool"].double()
    group = q.shape[1] // k.shape[2]
    keys = k.repeat_interleave(group, dim=2).flatten(0, 1)  # [slots, heads, dim]
    return float(torch.einsum("shd,nhd->nsh", keys, q).abs().max()) / HEAD_DIM**0.5


def _expected(cases: dict[str, dict[str, Any]], mistakes: tuple[str, ...]) -> dict[str, Any]:
    """Each case's right output, what each typical mistake would give, and how large its scores get: computed on
    the CPU, a value at a time (as many small steps would crawl on a GPU)."""
    tensors = ("q", "k_pool", "v_pool", "block_tables", "context_lens")
    expected = {}
    for name, case in cases.items():
        args = [case[key].cpu() for key in tensors]
        splits = case.get("num_splits", 1)
        expected[name] = {
            "out": simulate(*args, num_splits=splits),
            "wrong": {key: simulate(*args, num_splits=splits, **MISTAKES[key][0]) for key in mistakes},
            "max_score": _max_score(dict(zip(tensors, args))),
            "hint": BF16_HINT if case["k_pool"].dtype == torch.bfloat16 else None,
        }
    return expected


def _rows(mask: torch.Tensor) -> str:
    """The (sequence, query head) rows where ``mask`` holds, the first few named."""
    rows = [tuple(index) for index in mask.nonzero().tolist()]
    shown = ", ".join(f"({seq}, {head})" for seq, head in rows[:4])
    return f"{len(rows)} of {mask.numel()} (sequence, query head) rows: {shown}{', ...' if len(rows) > 4 else ''}"


def _non_finite(have: torch.Tensor, max_score: float) -> str:
    """What the NaN and inf in ``have`` are, told apart from an overflow where the scores cannot overflow."""
    bad = ~torch.isfinite(have).all(dim=-1)
    if max_score > OVERFLOWS:
        return (
            f"NaN or inf in {_rows(bad)}, with scores up to {max_score:.0f}: exp of a score (or of a split's max) "
            "past 88 overflows float32, and inf / inf is NaN. Subtract the running max before exp (in the merge, "
            "the overall max: exp(max_s - overall_max))."
        )
    return (
        f"NaN or inf in {_rows(bad)}, though no score here passes {max_score:.0f}, so exp cannot overflow: a NaN "
        "is 0/0 (a row whose sum l stayed 0: nothing added, or every weight 0) or exp(-inf - -inf) (a max still "
        "-inf subtracted from -inf: a block or split with no visible slot, or a masked load's `other` left at "
        "-inf). Check the masks, the starting values, and that an empty split is given weight 0."
    )


def _compare_cases(expected: dict[str, Any], got: dict[str, Any]) -> Mismatch | Note | None:
    for name, want in expected.items():
        have = got.get(name) if isinstance(got, dict) else None
        if isinstance(have, torch.Tensor) and have.shape == want["out"].shape:
            unwritten = (have == torch.tensor(UNWRITTEN, dtype=have.dtype)).all(dim=-1)
            if unwritten.any():
                return Mismatch(
                    f"the kernel never wrote {_rows(unwritten)}",
                    "Every (sequence, query head) row of the output is stored once: check the store's offsets "
                    "and its mask (mask only the padding rows, in_group >= GROUP), and the grid's programs.",
                ).within(name)
        mismatch = compare_tensors(
            want["out"], have, dims=("sequence", "query head", "dim"), what="attention output", atol=ATOL, rtol=RTOL
        )
        if mismatch is None:
            continue
        for key, wrong in want["wrong"].items():
            if isinstance(have, torch.Tensor) and have.shape == wrong.shape:
                if torch.allclose(have.double(), wrong.double(), atol=ATOL, rtol=RTOL, equal_nan=True):
                    return Mismatch(mismatch.difference, MISTAKES[key][1]).within(name)
        if isinstance(have, torch.Tensor) and not torch.isfinite(have).all():
            return Mismatch(mismatch.difference, _non_finite(have, want["max_score"])).within(name)
        return Mismatch(mismatch.difference, want["hint"] or mismatch.hint).within(name)
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
        "outs": _expected(inputs["cases"], ("max", "block_max", "rescale", "tail", "head", "table")),
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
            oracle=lambda cases: _expected(cases, ("merge", "merge_max", "rescale", "tail", "table")),
            compare=_compare_cases,
            source_rule=kernel_rule(("split_kv_kernel", "merge_splits_kernel")),
            tested="your kernel cell holds Triton kernels only and compiles for an H100 (sm_90); under Triton's "
            "interpreter your split and merge kernels with 1, 3 and 5 splits (not powers of two; some splits empty), "
            "large scores and bf16 pools, 3 query heads per KV head, equal labkit's attention",
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
