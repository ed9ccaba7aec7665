"""Lab 5, exercise 2: the slot mapping, where token ``pos`` of a sequence lives in the pool."""

from __future__ import annotations

from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints


def _slot_cases(seed: int) -> list[tuple[list[int], int, int, int]]:
    r = rng(seed)
    cases = []
    for block_size, start, end in ((16, 0, 62), (16, 61, 62), (4, 5, 11), (8, r.randint(0, 20), 40)):
        table = r.sample(range(100), -(-end // block_size))
        cases.append((table, start, end, block_size))
    return cases


def _slots(table, start, end, block_size) -> list[int]:
    return [table[pos // block_size] * block_size + pos % block_size for pos in range(start, end)]


def _compare_slots(expected, got) -> Mismatch | None:
    cases, want_all = expected
    for (table, start, end, block_size), want, have in zip(cases, want_all, got):
        if have == want:
            continue
        where = f"table {table}, block_size {block_size}, positions {start}..{end - 1}"
        if not isinstance(have, list) or len(have) != len(want):
            return Mismatch(
                f"{where}: expected {len(want)} slots, got {have!r:.80}",
                "Return one slot (an int) per position in range(start, end).",
            )
        first = next(i for i, (w, h) in enumerate(zip(want, have)) if w != h)
        hint = "slot = table[pos // block_size] * block_size + pos % block_size."
        if have == [pos for pos in range(start, end)]:
            hint = "You returned the positions themselves: look the block up in the block table first."
        elif all(h - w in (1, -1) and h - w == have[0] - want[0] for w, h in zip(want, have)):
            hint = "Every slot is off by one: positions count from 0, and so do offsets inside a block."
        return Mismatch(f"{where}, position {start + first}: expected slot {want[first]}, got {have[first]}", hint)
    return None


def _slot_error_hint(record: dict[str, Any]) -> str | None:
    """An IndexError here means a block was asked of the table beyond the ones the positions need."""
    if record["error"] == "IndexError":
        return (
            "Your code looked up a block the table does not have. The new tokens are positions start .. end - 1 "
            "(range(start, end) stops before end), and position pos lives in the table's entry pos // block_size."
        )
    return None


register(
    diagnosed(
        Exercise(
            id="lab5.slot_mapping",
            functions=("slot_mapping",),
            answers=("labkit.labs.lab5._slots",),
            make_inputs=_slot_cases,
            run=lambda functions, cases: [[int(s) for s in functions[0](*case)] for case in cases],
            oracle=lambda cases: (cases, [_slots(*case) for case in cases]),
            compare=_compare_slots,
            tested="slot_mapping(block_table, start, end, block_size) for 4 seeded tables: the slot of every position",
            hint="A position picks an entry of the block table (which block) and an offset inside that block; the slot "
            'counts whole blocks before it, then the offset. labkit.hint("lab5.slot_mapping") shows more.',
        ),
        known=_slot_error_hint,
    )
)

register_hints(
    "lab5.slot_mapping",
    "The pool is one long row of slots, block after block. A token's slot is where its block starts in that row, "
    "plus its offset inside the block.",
    "For each position from start up to, not including, end: its entry in the table is pos // block_size, that "
    "entry names the block, and the offset inside the block is pos % block_size.",
    "[block_table[pos // block_size] * block_size + pos % block_size for pos in range(start, end)]",
)
