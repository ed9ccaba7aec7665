"""Lab 11, exercise 3: ``decode_bytes``, the bytes one layer's decode step reads, kernel against gather-then-SDPA;
the typical miscounts are computed for each shape, so the message names the one an answer shows."""

from __future__ import annotations

from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.kernels.traffic import DecodeShape, decode_bytes
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints


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
