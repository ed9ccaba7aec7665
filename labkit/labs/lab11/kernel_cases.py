"""Lab 11, what the two kernel checks share: seeded pools and block tables, the right output and each typical
mistake's (simulated in :mod:`~labkit.labs.lab11.variants`), and the comparison that names the mistake an output
shows."""

from __future__ import annotations

from typing import Any

import torch

from labkit.grading.compare import compare_tensors
from labkit.grading.result import Mismatch, Note
from labkit.kernels.contract import UNWRITTEN
from labkit.labs.common.shared import on_check_device, rng, torch_generator
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
TENSORS = ("q", "k_pool", "v_pool", "block_tables", "context_lens")  # a case's tensors, in the launchers' order
OVERFLOWS = 80.0  # scores past this overflow exp in float32 (88.7) once a few are added: below it, a NaN is no overflow

MISTAKES: dict[str, tuple[dict[str, Any], str]] = {  # simulate()'s switch -> what the learner is told
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


def expected_outputs(cases: dict[str, dict[str, Any]], mistakes: tuple[str, ...]) -> dict[str, Any]:
    """Each case's right output, what each typical mistake would give, and how large its scores get: computed on
    the CPU, a value at a time (as many small steps would crawl on a GPU)."""
    expected = {}
    for name, case in cases.items():
        args = [case[key].cpu() for key in TENSORS]
        splits = case.get("num_splits", 1)
        expected[name] = {
            "out": simulate(*args, num_splits=splits),
            "wrong": {key: simulate(*args, num_splits=splits, **MISTAKES[key][0]) for key in mistakes},
            "max_score": _max_score(dict(zip(TENSORS, args))),
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


def compare_cases(expected: dict[str, Any], got: dict[str, Any]) -> Mismatch | Note | None:
    """Case by case: every output row written, then the output within the tolerance, a typical mistake named."""
    for name, want in expected.items():
        have = got.get(name) if isinstance(got, dict) else None
        mismatch = _unwritten(want, have) or _differs(want, have)
        if mismatch is not None:
            return mismatch.within(name)
    return None


def _unwritten(want: dict[str, Any], have: Any) -> Mismatch | None:
    """Rows the kernel never stored still hold the launch's fill value."""
    if isinstance(have, torch.Tensor) and have.shape == want["out"].shape:
        unwritten = (have == torch.tensor(UNWRITTEN, dtype=have.dtype)).all(dim=-1)
        if unwritten.any():
            return Mismatch(
                f"the kernel never wrote {_rows(unwritten)}",
                "Every (sequence, query head) row of the output is stored once: check the store's offsets "
                "and its mask (mask only the padding rows, in_group >= GROUP), and the grid's programs.",
            )
    return None


def _differs(want: dict[str, Any], have: Any) -> Mismatch | None:
    """The attention output against the right one; a typical mistake, a NaN or the bf16 case named."""
    mismatch = compare_tensors(
        want["out"], have, dims=("sequence", "query head", "dim"), what="attention output", atol=ATOL, rtol=RTOL
    )
    if mismatch is None:
        return None
    for key, wrong in want["wrong"].items():
        if isinstance(have, torch.Tensor) and have.shape == wrong.shape:
            if torch.allclose(have.double(), wrong.double(), atol=ATOL, rtol=RTOL, equal_nan=True):
                return Mismatch(mismatch.difference, MISTAKES[key][1])
    if isinstance(have, torch.Tensor) and not torch.isfinite(have).all():
        return Mismatch(mismatch.difference, _non_finite(have, want["max_score"]))
    return Mismatch(mismatch.difference, want["hint"] or mismatch.hint)
