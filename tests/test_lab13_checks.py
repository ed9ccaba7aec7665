"""Lab 13's checks: the right answers pass under several seeds, and each typical wrong one fails with its mistake named.

The answers are the solved notebook's own cells (``tests/lab_sources.py``); a wrong answer is the solution with one
typical mistake edited in, or written here as a learner would write it, so a check that stopped telling them apart
would fail. The stand-in kernels are checked to move (and not move) as the checks assume, on every machine.
"""

from __future__ import annotations

import pytest
import torch

from labkit.grading import evaluate
from labkit.grading.result import NOT_DONE
from labkit.labs import lab13
from labkit.labs.hints import tiers
from labkit.labs.lab13 import kernels, matmul, runs, split_kv
from tests.lab_sources import solved_exercise

pytestmark = [pytest.mark.lab13]
SEEDS = [0, 1, 5]


def which(*edits):
    return solved_exercise("lab13.which_moved", ("which_moved",), edits)[0]


def tiles(*edits):
    return solved_exercise("lab13.invariant_matmul", ("invariant_matmul",), edits)[0]


def splits(*edits):
    return solved_exercise("lab13.split_kv", ("split_kv_attention",), edits)[0]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "exercise, answer", [("which_moved", which), ("invariant_matmul", tiles), ("split_kv", splits)]
)
def test_the_solved_answers_pass(exercise, answer, seed):
    result = evaluate(f"lab13.{exercise}", answer(), seed=seed)
    assert result.passed, result.message


WHICH_MISTAKES = [
    ((("torch.equal(operation(crowd[:m])[0], alone)", "torch.allclose(operation(crowd[:m])[0], alone)"),), "tolerance"),
    ((("range(2, len(crowd) + 1)", "[len(crowd)]"),), "tried only the whole crowd"),
    ((("range(2, len(crowd) + 1)", "[2]"),), "tried only a batch of 2"),
    ((("if any(not torch.equal", "if not any(not torch.equal"),), "did NOT move"),
    ((("torch.equal(operation(crowd[:m])[0], alone)", "torch.equal(operation(crowd[:m]), alone)"),), "named every"),
    ((("operation(crowd[:m])[0], alone", "operation(crowd[:m])[m - 1], alone"),), "named every"),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("edits, words", WHICH_MISTAKES, ids=lambda value: str(value)[:40])
def test_a_wrong_probe_fails_with_its_mistake_named(edits, words, seed):
    result = evaluate("lab13.which_moved", which(*edits), seed=seed)
    assert not result.passed and words in result.message, result.message
    assert "expected ['op " in result.message  # the first difference, by the operations' names


def test_a_probe_that_returns_something_else_is_told_to_return_names():
    result = evaluate("lab13.which_moved", lambda operations, crowd: len(operations))
    assert not result.passed and "Return a list of the operations' names" in result.message


def one_product(x, weight, matmul, tile_rows):
    return matmul(x, weight)


def a_fixed_number_of_tiles(x, weight, matmul, tile_rows):
    return torch.cat([matmul(tile, weight) for tile in x.chunk(4)])


def tiles_of_the_reduction(x, weight, matmul, tile_rows):
    return sum(matmul(x[:, i : i + tile_rows], weight[:, i : i + tile_rows]) for i in range(0, x.shape[1], tile_rows))


TILE_MISTAKES = [
    (one_product, "one product for the whole batch"),
    (
        tiles(
            ("F.pad(x, (0, 0, 0, -len(x) % tile_rows))", "x"),
        ),
        "The last tile was not padded",
    ),
    (
        tiles(
            ("padded.split(tile_rows)", "padded.split(min(tile_rows, len(x)))"),
        ),
        "tiles of min(tile_rows, n) rows",
    ),
    (a_fixed_number_of_tiles, "a fixed NUMBER of tiles is not a fixed tile"),
    (tiles_of_the_reduction, "You tiled the columns"),
    (
        tiles(
            ("split(tile_rows)", "split(2 * tile_rows)"),
        ),
        "Every call must get exactly tile_rows",
    ),
    (tiles(("[: len(x)]", "")), "Cut the padded rows off"),
    (lambda x, weight, matmul, tile_rows: tiles()(x, weight, matmul, tile_rows).T, "The product is transposed"),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("answer, words", TILE_MISTAKES, ids=lambda value: getattr(value, "__name__", str(value)[:30]))
def test_a_wrong_tiling_fails_with_its_mistake_named(answer, words, seed):
    result = evaluate("lab13.invariant_matmul", answer, seed=seed)
    assert not result.passed and words in result.message, result.message
    assert "in tiles of" in result.message  # where: the batch and the tile


def a_fixed_number_of_splits(q, keys, values, length, split_size, partial):
    return splits()(q, keys, values, length, -(-len(keys) // 4), partial)


def its_own_softmax(q, keys, values, length, split_size, partial):
    weights = torch.softmax(torch.einsum("hd,khd->hk", q, keys[:length]) / q.shape[-1] ** 0.5, dim=-1)
    return torch.einsum("hk,khd->hd", weights, values[:length])


def splits_over_the_width_summed_by_torch(q, keys, values, length, split_size, partial):
    parts = [partial(q, keys[s : min(s + split_size, length)], values[s : min(s + split_size, length)])
             for s in range(0, len(keys), split_size)]  # fmt: skip
    maxes = torch.stack([m for m, _, _ in parts])
    scale = torch.exp(maxes - maxes.amax(dim=0))
    acc = (scale[..., None] * torch.stack([a for _, _, a in parts])).sum(dim=0)
    return acc / (scale * torch.stack([share for _, share, _ in parts])).sum(dim=0)[:, None]


SPLIT_MISTAKES = [
    (a_fixed_number_of_splits, "a fixed NUMBER of splits"),
    (
        splits(("split_size, length)", "split_size, len(keys))"), ("range(0, length,", "range(0, len(keys),")),
        "The splits ran past length",
    ),  # fmt: skip
    (splits(("torch.exp(m - largest)", "torch.exp(m)")), "exp(m_s) overflows float32"),
    (splits(("scale * share", "share"), ("scale[:, None] * weighted", "weighted")), "added the splits as they are"),
    (splits(("scale * share", "share")), "The sum l was not rescaled"),
    (splits(("scale[:, None] * weighted", "weighted")), "The weighted values acc were not rescaled"),
    (its_own_softmax, "partial was never called"),
    (splits_over_the_width_summed_by_torch, "empty splits past length"),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("answer, words", SPLIT_MISTAKES, ids=lambda value: getattr(value, "__name__", str(value)[:30]))
def test_a_wrong_split_kv_fails_with_its_mistake_named(answer, words, seed):
    result = evaluate("lab13.split_kv", answer, seed=seed)
    assert not result.passed and words in result.message, result.message
    assert "query " in result.message and "a tensor of" in result.message  # where: the query, its place


def test_an_online_merge_passes_too():
    """A running max rescaled split by split (as flash-decoding merges) adds in an order fixed by the positions too."""

    def online(q, keys, values, length, split_size, partial):
        for start in range(0, length, split_size):
            m, share, acc_s = partial(q, keys[start : start + split_size][: length - start],
                                      values[start : start + split_size][: length - start])  # fmt: skip
            if start == 0:
                largest, total, acc = m, share, acc_s
                continue
            new = torch.maximum(largest, m)
            total = total * torch.exp(largest - new) + share * torch.exp(m - new)
            acc = acc * torch.exp(largest - new)[:, None] + acc_s * torch.exp(m - new)[:, None]
            largest = new
        return acc / total[:, None]

    for seed in SEEDS:
        result = evaluate("lab13.split_kv", online, seed=seed)
        assert result.passed, result.message


@pytest.mark.parametrize("exercise", ["which_moved", "invariant_matmul", "split_kv"])
def test_an_unwritten_exercise_is_not_done_and_a_crash_points_at_the_line(exercise):
    def blank(*args):
        raise NotImplementedError

    def crashes(*args):
        return args[0].no_such_attribute

    assert evaluate(f"lab13.{exercise}", blank).status == NOT_DONE
    result = evaluate(f"lab13.{exercise}", crashes)
    assert not result.passed and "AttributeError" in result.message and "crashes" in result.message


@pytest.mark.parametrize("seed", range(8))
def test_every_typical_mistake_is_told_apart_on_every_seed(seed):
    operations, crowd = lab13.moved_cases(seed)
    right = sorted(lab13.course_which_moved(operations, crowd))
    wrong = [sorted(mistake(operations, crowd)) for mistake in lab13.MISTAKES.values()]
    assert len(right) == 4 and all(answer != right for answer in wrong)
    assert len({tuple(answer) for answer in wrong}) == len(wrong)  # each mistake its own answer, so its own name


def test_the_stand_in_library_moves_at_its_paths_and_tiles_do_not():
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(20, 48, generator=generator), torch.randn(8, 48, generator=generator)
    library = kernels.RowPathMatmul()
    alone = library(x[:1], weight)[0]
    assert not torch.equal(library(x[:2], weight)[0], alone) and not torch.equal(library(x[:5], weight)[0], alone)
    assert torch.equal(library(x[:5], weight)[0], library(x[:20], weight)[0])  # one path from four rows on
    assert torch.allclose(library(x, weight), x @ weight.T, atol=1e-4)
    tiled = [matmul.course_invariant_matmul(x[:n], weight, library, 16)[0] for n in (1, 3, 17)]
    assert all(torch.equal(row, tiled[0]) for row in tiled)


def test_a_split_partial_is_the_same_whatever_keys_it_is_cut_with_and_the_merge_is_attention():
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(3, 16, generator=generator)
    keys, values = torch.randn(30, 3, 16, generator=generator), torch.randn(30, 3, 16, generator=generator)
    out = split_kv.course_split_kv_attention(q, keys, values, 21, 8, kernels.split_partial)
    weights = torch.softmax(torch.einsum("hd,khd->hk", q, keys[:21]) / 4, dim=-1)
    assert torch.allclose(out, torch.einsum("hk,khd->hd", weights, values[:21]), atol=1e-5)
    same = split_kv.course_split_kv_attention(q, keys[:21], values[:21], 21, 8, kernels.split_partial)
    assert torch.equal(out, same)
    m, share, acc = kernels.split_partial(q, keys[:0], values[:0])
    assert torch.isinf(m).all() and not share.any() and not acc.any()  # an empty split adds nothing
    with pytest.raises(ValueError, match=r"q \[H, D\] and keys and values \[n, H, D\]"):
        kernels.split_partial(q, keys[:, 0], values[:, 0])


def test_the_stand_in_library_names_a_wrong_shape():
    with pytest.raises(ValueError, match=r"a @ weight.T"):
        kernels.RowPathMatmul()(torch.zeros(2, 3), torch.zeros(3, 4))


def test_every_exercise_has_hints_in_tiers():
    assert all(len(tiers(f"lab13.{name}")) >= 2 for name in ("which_moved", "invariant_matmul", "split_kv"))


def test_this_machines_operations_run_and_the_probe_reports_without_a_verdict():
    operations, crowd = runs.this_machines_operations()
    moved = lab13.course_which_moved(operations, crowd)
    assert set(moved) <= set(operations)
    assert not any("tiled_linear" in name for name in moved)  # labkit's tiles never move, on any machine
    assert all(op(crowd).shape[0] == len(crowd) for op in operations.values())
