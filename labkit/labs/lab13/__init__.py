"""Lab 13, the same answer every time: why a request's bits change with its batch, and kernels whose bits do not.

Part 1's check, ``which_moved`` on seeded operations built to move (or not) in known ways on every machine, is here;
parts 2 and 3 are checked in :mod:`~labkit.labs.lab13.matmul` and :mod:`~labkit.labs.lab13.split_kv` (importing
this package registers all three, in the order the notebook shows them).
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from typing import Any

import torch

from labkit.batch_invariant import fixed_order_sum
from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import on_check_device, rng, torch_generator
from labkit.labs.hints import register_hints
from labkit.labs.lab13.kernels import _reduce

Operation = Callable[[torch.Tensor], torch.Tensor]
WIDTH, OUT = 48, 8  # the crowd's columns and each operation's outputs per row

# how each seeded operation behaves -> the sum order it takes for a batch of m rows (the elementwise one sums nothing)
BEHAVIOURS: dict[str, Callable[[int], str]] = {
    "elementwise, never moves": lambda m: "none",
    "one order at every batch size": lambda m: "one row",
    "another order past one row": lambda m: "one row" if m == 1 else "two or three rows",
    "another order at two or three rows only": lambda m: "two or three rows" if m in (2, 3) else "one row",
    "another order from four rows on": lambda m: "four rows and more" if m >= 4 else "one row",
    "batch statistics (mixes the rows)": lambda m: "one row",
}


def _operation(behaviour: str, weight: torch.Tensor) -> Operation:
    """An operation [m, WIDTH] -> [m, OUT] whose sum over the columns takes the order ``behaviour`` gives for m rows."""
    order = BEHAVIOURS[behaviour]
    if behaviour.startswith("elementwise"):
        return lambda rows: rows[:, :OUT] * 3.0 + 1.0
    if behaviour.startswith("batch statistics"):  # each row minus the batch's mean, then a product
        return lambda rows: _reduce((rows - fixed_order_sum(rows, dim=0) / len(rows))[:, None, :] * weight, "one row")
    return lambda rows: _reduce(rows[:, None, :] * weight[None], order(len(rows)))


def moved_cases(seed: int) -> tuple[dict[str, Operation], torch.Tensor]:
    """The six operations under seeded letters, in a seeded order, and a crowd of 5 to 8 rows."""
    r, generator = rng(seed), torch_generator(seed)
    behaviours = list(BEHAVIOURS)
    r.shuffle(behaviours)
    letters = r.sample(string.ascii_uppercase, len(behaviours))
    weight = on_check_device(torch.rand(OUT, WIDTH, generator=generator) + 0.5)  # positive: no sum cancels to ~0
    operations = {f"op {letter}": _operation(b, weight) for letter, b in zip(letters, behaviours)}
    crowd = on_check_device(torch.rand(r.randint(5, 8), WIDTH, generator=generator) + 0.5)
    return operations, crowd


def moving_sizes(operation: Operation, crowd: torch.Tensor) -> str:
    """The batch sizes at which ``operation``'s row 0 differs from alone, in words (for the message that names it)."""
    alone = operation(crowd[:1])[0]
    sizes = [m for m in range(2, len(crowd) + 1) if not torch.equal(operation(crowd[:m])[0], alone)]
    return f"its row 0 changes at {sizes} rows" if sizes else "its row 0 is the same at every batch size"


def _row_moves(operation: Operation, crowd: torch.Tensor, sizes: Sequence[int], same) -> bool:
    alone = operation(crowd[:1])[0]
    return any(not same(operation(crowd[:m])[0], alone) for m in sizes)


def course_which_moved(operations: dict[str, Operation], crowd: torch.Tensor) -> list[str]:
    """The operations whose row 0 is not bit for bit the same in some batch of 2 to n rows as alone."""
    sizes = range(2, len(crowd) + 1)
    return [name for name, operation in operations.items() if _row_moves(operation, crowd, sizes, torch.equal)]


def _within_tolerance(operations, crowd) -> list[str]:
    sizes = range(2, len(crowd) + 1)
    return [name for name, op in operations.items() if _row_moves(op, crowd, sizes, torch.allclose)]


def _whole_crowd_only(operations, crowd) -> list[str]:
    return [name for name, op in operations.items() if _row_moves(op, crowd, [len(crowd)], torch.equal)]


def _pair_only(operations, crowd) -> list[str]:
    return [name for name, op in operations.items() if _row_moves(op, crowd, [2], torch.equal)]


def _the_ones_that_stayed(operations, crowd) -> list[str]:
    moved = course_which_moved(operations, crowd)
    return [name for name in operations if name not in moved]


MISTAKES: dict[str, Callable[[dict[str, Operation], torch.Tensor], list[str]]] = {
    "You compared within a tolerance (torch.allclose, or a difference below some epsilon): that finds only an "
    "operation that mixes the rows. Batch variance lives in the last bits (a sum added in another order differs "
    "by about 1e-7 of its size), so compare bit for bit: torch.equal.": _within_tolerance,
    "You tried only the whole crowd (a batch of n rows): an operation whose library takes another path at two or "
    "three rows only, as MKL's fp32 product did on the course's machine, comes back to row 0's bits at n. Try "
    "every batch size from 2 to n.": _whole_crowd_only,
    "You tried only a batch of 2: an operation whose order changes from four rows on looks the same there. Try "
    "every batch size from 2 to n.": _pair_only,
    "You named the operations that did NOT move: return those whose row 0 differs in some batch.": (
        _the_ones_that_stayed
    ),
    "You named every operation, even those whose row 0 comes out the same at every batch size: compare row 0 of "
    "the batch's result, operation(crowd[:m])[0], with row 0 alone, operation(crowd[:1])[0] (not the whole "
    "outputs, whose shapes differ, nor another row).": lambda operations, crowd: list(operations),
}


def _names(answer: Any) -> list[str] | str:
    """The answer as a sorted list of names, or words saying what it was (the grader takes plain data only)."""
    if isinstance(answer, (list, tuple, set)) and all(isinstance(name, str) for name in answer):
        return sorted(answer)
    return f"a {type(answer).__name__}: {answer!r:.60}"


def _oracle(inputs: tuple[dict[str, Operation], torch.Tensor]) -> dict[str, Any]:
    operations, crowd = inputs
    return {
        "right": sorted(course_which_moved(operations, crowd)),
        "wrong": {hint: sorted(mistake(operations, crowd)) for hint, mistake in MISTAKES.items()},
        "behaviour": {name: moving_sizes(operation, crowd) for name, operation in operations.items()},
        "rows": len(crowd),
    }


def _compare(expected: dict[str, Any], got: list[str] | str) -> Mismatch | None:
    if isinstance(got, str):
        return Mismatch(f"which_moved returned {got}", "Return a list of the operations' names (the dict's keys).")
    right = expected["right"]
    if got == right:
        return None
    missed, extra = sorted(set(right) - set(got)), sorted(set(got) - set(right))
    said = [f"{name} ({expected['behaviour'].get(name, 'not one of the operations')})" for name in missed + extra]
    where = (
        f"a crowd of {expected['rows']} rows: expected {right}, got {got}"
        + (f"; missed {', '.join(said[: len(missed)])}" if missed else "")
        + (f"; named too {', '.join(said[len(missed) :])}" if extra else "")
    )
    hint = next((hint for hint, wrong in expected["wrong"].items() if wrong == got), None)
    return Mismatch(where, hint)


register(
    diagnosed(
        Exercise(
            id="lab13.which_moved",
            functions=("which_moved",),
            answers=("labkit.labs.lab13.course_which_moved",),
            make_inputs=moved_cases,
            run=lambda functions, inputs: _names(functions[0](*inputs)),
            oracle=_oracle,
            compare=_compare,
            tested="which_moved on six seeded operations (two that never move, one whose sum changes order past one "
            "row, one only at two or three rows, one only from four rows, one that mixes the rows) and a crowd of 5 "
            "to 8 rows: exactly the operations whose row 0 changes in some batch, bit for bit",
            hint="For each operation compare operation(crowd[:1])[0] with operation(crowd[:m])[0] for every m from 2 "
            'to len(crowd), with torch.equal. labkit.hint("lab13.which_moved") shows more.',
        )
    )
)

register_hints(
    "lab13.which_moved",
    "Your request is row 0. Compute its result alone, then in each batch of the crowd's first m rows; an operation "
    "moved if any of those row-0 results differs from alone in any bit.",
    "alone = op(crowd[:1])[0]; moved if any(not torch.equal(op(crowd[:m])[0], alone) for m in range(2, "
    "len(crowd) + 1)). A tolerance (allclose) hides exactly what you are looking for.",
    "return [name for name, op in operations.items() if any(not torch.equal(op(crowd[:m])[0], op(crowd[:1])[0]) "
    "for m in range(2, len(crowd) + 1))]",
)

# parts 2 and 3, registered after part 1 so the exercises number as the notebook shows them
from labkit.labs.lab13 import matmul  # noqa: E402, F401, I001
from labkit.labs.lab13 import split_kv  # noqa: E402, F401
