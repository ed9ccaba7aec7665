"""Lab 13, exercise 2: ``invariant_matmul(x, weight, matmul, tile_rows)``, a matmul whose every row comes out the
same whatever the batch, by handing ``matmul`` (a stand-in library whose order of adding depends on the number of rows
it is handed, :class:`~labkit.labs.lab13.kernels.RowPathMatmul`) only tiles of exactly ``tile_rows`` rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import on_check_device, rng, torch_generator
from labkit.labs.hints import register_hints
from labkit.labs.lab13.kernels import RowPathMatmul, path_for

Matmul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
BATCHES = (1, 2, 3, 5, 16, 17, 19, 37)  # rows of x in each call: alone, the stand-in's every path, past a tile


def course_invariant_matmul(x: torch.Tensor, weight: torch.Tensor, matmul: Matmul, tile_rows: int) -> torch.Tensor:
    """``x @ weight.T`` through ``matmul`` on tiles of exactly ``tile_rows`` rows, the last one padded with zeros."""
    padded = F.pad(x, (0, 0, 0, -len(x) % tile_rows))
    return torch.cat([matmul(tile, weight) for tile in padded.split(tile_rows)])[: len(x)]


def _one_product(x, weight, matmul, tile_rows):
    return matmul(x, weight)


def _unpadded_tiles(x, weight, matmul, tile_rows):
    return torch.cat([matmul(tile, weight) for tile in x.split(tile_rows)])


def _four_tiles(x, weight, matmul, tile_rows):
    return torch.cat([matmul(tile, weight) for tile in x.chunk(4)])


def _tiles_over_the_sum(x, weight, matmul, tile_rows):
    return sum(matmul(x[:, i : i + tile_rows], weight[:, i : i + tile_rows]) for i in range(0, x.shape[1], tile_rows))


MISTAKES: dict[str, Callable[..., torch.Tensor]] = {
    "The library saw as many rows as the batch (one product for the whole batch, or tiles of min(tile_rows, n) "
    "rows): it picks its path (its order of adding) by the number of rows, so a row's bits change with the batch. "
    "Cut x into tiles of exactly tile_rows rows and multiply tile by tile.": _one_product,
    "The last tile was not padded: a batch of 17 rows in tiles of 16 hands the library a tile of 1 row, which takes "
    "another path than 16. Pad x with zero rows up to a multiple of tile_rows (F.pad(x, (0, 0, 0, -n % tile_rows))) "
    "and cut the padding off the result.": _unpadded_tiles,
    "The tiles depend on the batch (x.chunk(4) gives tiles of n / 4 rows): a fixed NUMBER of tiles is not a fixed "
    "tile. Every tile must have tile_rows rows whatever n is.": _four_tiles,
    "You tiled the columns (the sum over k), not the rows: the library still sees all n rows in every call, and "
    "adding the partial products is yet another order. Tile the rows: x[i : i + tile_rows].": _tiles_over_the_sum,
}


def matmul_cases(seed: int) -> list[dict[str, Any]]:
    """Two crowds and weights, one multiplied in tiles of 16 rows, one in tiles of 4 (so both sides of the stand-in's
    path changes are in play), each at every batch size of :data:`BATCHES`."""
    r, generator = rng(seed), torch_generator(seed)
    cases = []
    for tile_rows in (16, 4):
        k, out = r.choice([40, 48, 64]), r.randint(6, 10)
        cases.append(
            {
                "crowd": torch.randn(max(BATCHES), k, generator=generator),
                "weight": torch.randn(out, k, generator=generator),
                "tile_rows": tile_rows,
            }
        )
    return on_check_device(cases)


def _run(functions, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The learner's product of each case's first n rows, for every n, with the row counts the library was handed."""
    results = []
    for case in cases:
        for n in BATCHES:
            library = RowPathMatmul()
            got = functions[0](case["crowd"][:n], case["weight"], library, case["tile_rows"])
            results.append({"out": got if isinstance(got, torch.Tensor) else repr(got)[:80], "rows": library.rows})
    return results


def _oracle(cases: list[dict[str, Any]]) -> dict[str, Any]:
    def outputs(function) -> list[torch.Tensor]:
        return [
            function(case["crowd"][:n], case["weight"], RowPathMatmul(), case["tile_rows"])
            for case in cases
            for n in BATCHES
        ]

    calls = [(n, case["tile_rows"]) for case in cases for n in BATCHES]
    return {
        "right": outputs(course_invariant_matmul),
        "wrong": {hint: outputs(mistake) for hint, mistake in MISTAKES.items()},
        "exact": [case["crowd"][:n].double() @ case["weight"].double().T for case in cases for n in BATCHES],
        "calls": calls,
    }


def _rows(count: int) -> str:
    return f"{count} row{'s' if count != 1 else ''}"


def _same(a: Any, b: torch.Tensor) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)


def _named(expected: dict[str, Any], got: list[dict[str, Any]], index: int | None = None) -> str | None:
    """The mistake whose outputs are the learner's bit for bit in every call, else (given ``index``) in that call."""
    wrong = expected["wrong"]
    for hint, outputs in wrong.items():
        if all(_same(result["out"], output) for result, output in zip(got, outputs)):
            return hint
    if index is None:
        return None
    return next((hint for hint, outputs in wrong.items() if _same(got[index]["out"], outputs[index])), None)


def _compare(expected: dict[str, Any], got: list[dict[str, Any]]) -> Mismatch | None:
    for index, (result, right, exact) in enumerate(zip(got, expected["right"], expected["exact"])):
        n, tile_rows = expected["calls"][index]
        where = f"a batch of {_rows(n)} in tiles of {tile_rows}"
        out = result["out"]
        if not isinstance(out, torch.Tensor):
            return Mismatch(f"{where}: invariant_matmul returned {out}", "Return the product, a torch.Tensor [n, out].")
        if out.shape != right.shape:
            hint = None
            if out.shape == right.shape[::-1]:
                hint = "The product is transposed: x [n, k] times weight [out, k] gives [n, out] (x @ weight.T)."
            elif out.shape[0] > n and out.shape[1:] == right.shape[1:]:
                hint = "Cut the padded rows off: return the first n rows."
            return Mismatch(f"{where}: the product has shape {tuple(out.shape)}, expected {tuple(right.shape)}", hint)
        if not torch.allclose(out.double(), exact, rtol=1e-4, atol=1e-4):
            return Mismatch(
                f"{where}: not x @ weight.T (largest difference {float((out.double() - exact).abs().max()):.3g})",
                "matmul(a, weight) multiplies a [rows, k] by weight [out, k]; each tile's product gives its rows of "
                "the result, in order.",
            )
        if not torch.equal(out, right):
            rows = sorted({int(row) for row in (out != right).any(dim=1).nonzero().flatten()})
            calls = ", ".join(f"{_rows(count)} ({path_for(count)})" for count in dict.fromkeys(result["rows"]))
            hint = _named(expected, got, index) or (
                f"Every call of matmul must get exactly tile_rows rows: yours got {calls}. The library picks its path "
                "by the number of rows."
            )
            return Mismatch(
                f"{where}: rows {rows[:6]}{' ...' if len(rows) > 6 else ''} differ in their last bits from the same "
                f"rows multiplied in tiles of {tile_rows} (the library's calls had {calls})",
                hint,
            )
        if any(count != tile_rows for count in result["rows"]):
            return Mismatch(
                f"{where}: the bits are right, but matmul was called with {sorted(set(result['rows']))} rows",
                _named(expected, got)
                or f"Every call must get exactly tile_rows = {tile_rows} rows: this stand-in takes one path from four rows "
                "on, a real library may not (tiles of another size are other kernels, with other bits).",
            )
    return None


register(
    diagnosed(
        Exercise(
            id="lab13.invariant_matmul",
            functions=("invariant_matmul",),
            answers=("labkit.labs.lab13.matmul.course_invariant_matmul", "labkit.batch_invariant.tiled_linear"),
            make_inputs=matmul_cases,
            run=_run,
            oracle=_oracle,
            compare=_compare,
            tested=f"invariant_matmul on two seeded crowds, tiles of 16 and of 4 rows, batches of {list(BATCHES)} rows, "
            "through a stand-in library that adds in another order at one row, at two or three, and from four: every "
            "row bit for bit as tiles of tile_rows give it, and every call of the library exactly tile_rows rows",
            hint="Pad x with zero rows to a multiple of tile_rows, call matmul on each tile of tile_rows rows, "
            'concatenate, keep the first n rows. labkit.hint("lab13.invariant_matmul") shows more.',
        )
    )
)

register_hints(
    "lab13.invariant_matmul",
    "The library picks how to add by how many rows you hand it. Hand it the same number every time: a tile of "
    "tile_rows rows, padded with zero rows when the batch runs out.",
    "padded = F.pad(x, (0, 0, 0, -len(x) % tile_rows)) adds the zero rows; padded.split(tile_rows) cuts the tiles; "
    "torch.cat the products and keep [: len(x)].",
    "return torch.cat([matmul(tile, weight) for tile in F.pad(x, (0, 0, 0, -len(x) % tile_rows)).split(tile_rows)])"
    "[: len(x)]",
)
