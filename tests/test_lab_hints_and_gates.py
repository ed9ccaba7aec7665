"""Hints in tiers (labkit.hint) and the gate of demo cells (passed), on cheap exercises of labs 2, 4, 5 and 6."""

from __future__ import annotations

from pathlib import Path

import pytest

import labkit
from labkit.grading import hint_counts
from labkit.labs import hints
from labkit.labs.checking.gate import passed

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.lab2, pytest.mark.lab4, pytest.mark.lab5, pytest.mark.lab6]


@pytest.fixture(autouse=True)
def fresh_hint_counts(monkeypatch):
    monkeypatch.setattr(hint_counts, "_shown", {})


@pytest.mark.parametrize(
    "exercise_id",
    [
        "lab2.kv_cache",
        "lab2.generate_with_cache",
        "lab2.kv_bytes_per_token",
        "lab2.conversations_that_fit",
        "lab5.block_allocator",
        "lab5.slot_mapping",
        "lab5.paged_attention",
        "lab4.continuous_schedule",
        "lab4.ten_replies",
        "lab4.preemption",
        "lab4.serving_metrics",
        "lab6.chunked_schedule",
        "lab6.choose_budget",
        "lab6.prefill_chunks",
    ],
)
def test_every_exercise_of_labs_2_4_5_and_6_has_at_least_two_tiers(exercise_id):
    assert len(hints.tiers(exercise_id)) >= 2


@pytest.mark.parametrize("lab", ["lab4", "lab6"])
def test_labs_4_and_6_have_three_exercises_and_their_cells_no_code_hints(lab):
    import nbformat

    from labkit.grading.checks import exercises_for_lab
    from labkit.labs.checking.gate import exercise_number

    assert max(exercise_number(exercise) for exercise in exercises_for_lab(lab)) >= 3
    source = next((ROOT / "labs" / "source").glob(f"{lab}_*.ipynb"))
    for cell in nbformat.read(source, as_version=4).cells:
        if any(tag.startswith("exercise:") for tag in cell.metadata.get("tags", [])):
            assert "# HINT" not in cell.source


def test_each_call_shows_the_next_tier_and_the_kernel_counts_them(capsys):
    first, second, *_ = hints.tiers("lab5.slot_mapping")
    labkit.hint("lab5.slot_mapping")
    assert "Hint 1 of" in capsys.readouterr().out
    labkit.hint("lab5.slot_mapping")
    shown = capsys.readouterr().out
    assert "Hint 2 of" in shown and second in shown and first not in shown
    assert hints.hints_shown() == {"lab5.slot_mapping": 2}


def test_the_last_tier_repeats_and_is_counted_once(capsys):
    count = len(hints.tiers("lab2.kv_bytes_per_token"))
    for _ in range(count + 2):
        labkit.hint("lab2.kv_bytes_per_token")
    assert "that is the last one" in capsys.readouterr().out.splitlines()[-2]
    assert hints.hints_shown() == {"lab2.kv_bytes_per_token": count}


def test_an_exercise_without_tiers_has_its_checks_hint_as_the_only_one():
    from labkit.grading import get_exercise

    assert hints.tiers("lab1.causal_mask") == (get_exercise("lab1.causal_mask").hint,)


def test_fewer_than_two_tiers_are_refused():
    with pytest.raises(ValueError, match="at least two"):
        hints.register_hints("lab2.kv_cache", "only one")


def _gate(namespace: dict) -> bool:
    """``passed("lab5.slot_mapping")`` called from a cell whose globals are ``namespace``."""
    exec("result = passed('lab5.slot_mapping')", namespace)
    return namespace["result"]


def test_a_demo_cell_runs_only_once_its_exercise_passes(capsys):
    def slot_mapping(block_table, start, end, block_size):
        return [block_table[pos // block_size] * block_size + pos % block_size for pos in range(start, end)]

    def off_by_one(block_table, start, end, block_size):
        return [block_table[pos // block_size] * block_size + pos % block_size + 1 for pos in range(start, end)]

    def blank(block_table, start, end, block_size):
        raise NotImplementedError

    assert _gate({"passed": passed, "slot_mapping": slot_mapping})
    assert capsys.readouterr().out == ""
    for wrong in (off_by_one, blank):
        assert not _gate({"passed": passed, "slot_mapping": wrong})
        assert "skipped until exercise 2 passes" in capsys.readouterr().out


def test_a_lab4_demo_cell_waits_for_its_exercise_by_number(capsys):
    def serving_metrics(trace, slo):
        return {"ttft_ms": 0.0, "tpot_ms": 0.0, "itl_ms": 0.0, "goodput": 0.0}

    namespace = {"passed": passed, "serving_metrics": serving_metrics}
    exec("result = passed('lab4.serving_metrics')", namespace)
    assert namespace["result"] is False
    assert "skipped until exercise 3 passes" in capsys.readouterr().out


@pytest.mark.parametrize("lab", ["lab1", "lab2", "lab3", "lab4", "lab5", "lab6"])
def test_every_lab_states_its_time_and_how_it_was_obtained(lab):
    """One rule for all: the solved run's time, 12 minutes per exercise and 10 for the measurements."""
    import re

    import nbformat

    source = next((ROOT / "labs" / "source").glob(f"{lab}_*.ipynb"))
    cells = nbformat.read(source, as_version=4).cells
    intro = cells[0].source
    match = re.search(r"\*\*Time: about (\d+) minutes\.\*\* How we got it: the solved notebook runs in", intro)
    assert match, f"{lab}: no time estimate with how it was obtained"
    exercises = sum(any(t.startswith("exercise:") for t in c.metadata.get("tags", [])) for c in cells)
    assert f"({exercises} exercises)" in intro
    assert abs(int(match.group(1)) - (12 * exercises + 10)) <= 5
