"""Hints in tiers (labkit.hint) for every exercise of every lab, learner cells without code hints, and the gate of
demo cells (passed), on cheap exercises of labs 2, 4, 5 and 6."""

from __future__ import annotations

from pathlib import Path

import pytest

import labkit
from labkit.grading import evaluate, hint_counts
from labkit.labs import hints
from labkit.labs.common.gate import passed
from labkit.labs.manifest import LABS

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.lab2, pytest.mark.lab4, pytest.mark.lab5, pytest.mark.lab6]

EACH_LAB = [pytest.param(lab.name, marks=getattr(pytest.mark, lab.name)) for lab in LABS]
# Code that the learner notebook may show in an exercise's blank: the generated placeholder, nothing else.
BLANK_COMMENT = "# Your code here."


@pytest.fixture(autouse=True)
def fresh_hint_counts(monkeypatch):
    monkeypatch.setattr(hint_counts, "_shown", {})


def _exercise_cells(notebook: Path) -> dict[str, list]:
    """The cells of a notebook by the exercise id of their `exercise:` tag."""
    import nbformat

    cells: dict[str, list] = {}
    for cell in nbformat.read(notebook, as_version=4).cells:
        for tag in cell.metadata.get("tags", []):
            if tag.startswith("exercise:"):
                cells.setdefault(tag.removeprefix("exercise:"), []).append(cell)
    return cells


def _learner_notebook(lab: str) -> Path:
    return next((ROOT / "labs").glob(f"{lab}_*.ipynb"))


def _code_hints(source: str) -> list[str]:
    """Lines of an exercise cell that give code away: any comment but the blank's placeholder, and a raise whose
    blank is not just the placeholder (what `# HINT:` lines of a source notebook turn into)."""
    lines = source.splitlines()
    found = [line.strip() for line in lines if line.strip().startswith("#") and line.strip() != BLANK_COMMENT]
    for number, line in enumerate(lines):
        if 'raise NotImplementedError("Exercise' in line and (
            number == 0 or lines[number - 1].strip() != BLANK_COMMENT
        ):
            found.append(f"blank before the raise is {lines[number - 1].strip() if number else ''!r}")
    return found


@pytest.mark.parametrize("lab", EACH_LAB)
def test_every_exercise_of_every_lab_has_at_least_two_tiers(lab):
    """Every exercise the grader registers and every one a notebook tags, with two tiers or more."""
    from labkit.grading.checks import exercises_for_lab

    registered = {exercise.id for exercise in exercises_for_lab(lab)}
    tagged = set(_exercise_cells(_learner_notebook(lab)))
    assert tagged <= registered, f"{lab}: notebook exercises without a check: {sorted(tagged - registered)}"
    few = {exercise_id: len(hints.tiers(exercise_id)) for exercise_id in sorted(registered)}
    assert all(count >= 2 for count in few.values()), f"{lab}: exercises with fewer than two hint tiers: {few}"


@pytest.mark.parametrize("lab", EACH_LAB)
def test_no_learner_exercise_cell_gives_code_away(lab):
    """The learner sees the signature, the docstring, given scaffolding and a blank: no hints in code."""
    cells = _exercise_cells(_learner_notebook(lab))
    assert cells, f"{lab}: its learner notebook tags no exercise"
    hinted = {
        exercise_id: _code_hints(cell.source)
        for exercise_id, exercise_cells in cells.items()
        for cell in exercise_cells
        if cell.cell_type == "code" and _code_hints(cell.source)
    }
    assert not hinted, f"{lab}: exercise cells with code hints (put them in register_hints tiers): {hinted}"


def test_the_code_hint_finder_sees_a_hint_line_and_passes_a_bare_blank():
    signature = 'def f(x):\n    """Doc."""\n'
    raise_line = '    raise NotImplementedError("Exercise lab0.f: replace this line with your code")'
    assert _code_hints(f"{signature}    # Your code here.\n{raise_line}") == []
    assert _code_hints(f"{signature}    # HINT: return x + 1\n{raise_line}")
    assert _code_hints(f"{signature}{raise_line}")


@pytest.mark.parametrize("lab", ["lab4", "lab6"])
def test_labs_4_and_6_have_three_exercises_and_their_cells_no_code_hints(lab):
    import nbformat

    from labkit.grading.checks import exercises_for_lab
    from labkit.labs.common.gate import exercise_number

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


def test_an_exercise_without_tiers_has_its_checks_hint_as_the_only_one(monkeypatch):
    from labkit.grading import get_exercise

    hints.tiers("lab1.causal_mask")  # imports lab 1, which registers its tiers
    monkeypatch.delitem(hints._TIERS, "lab1.causal_mask")
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


def test_the_gate_after_a_check_reuses_its_verdict_and_a_redefined_function_is_checked_afresh(capsys):
    """A notebook checks, then a demo cell asks ``passed``: the learner's code (and the oracle) run once."""
    calls = []

    def counted(off: int):
        def slot_mapping(block_table, start, end, block_size):
            calls.append(off)
            return [block_table[p // block_size] * block_size + p % block_size + off for p in range(start, end)]

        return slot_mapping

    right, wrong = counted(0), counted(1)
    namespace = {"passed": passed, "slot_mapping": wrong}
    assert not evaluate("lab5.slot_mapping", namespace=namespace).passed
    ran = len(calls)
    assert ran >= 1 and not _gate(namespace) and len(calls) == ran  # the check's verdict, not a second run
    namespace["slot_mapping"] = right  # the learner fixes the cell and runs it again: a new function
    assert _gate(namespace) and len(calls) > ran
    fixed = len(calls)
    assert evaluate("lab5.slot_mapping", namespace=namespace).passed and len(calls) > fixed  # a check reruns
    capsys.readouterr()


def test_an_oracle_runs_once_per_seed_and_each_caller_gets_its_own_copy(monkeypatch):
    from dataclasses import replace

    from labkit.grading import judge
    from labkit.grading.checks import get_exercise

    runs = []

    def oracle(inputs):
        runs.append(inputs)
        return {"tokens": [1, 2, 3]}

    exercise = replace(get_exercise("lab5.slot_mapping"), id="lab5.counted_oracle", oracle=oracle)
    first = judge.expected_outputs(exercise, 0)
    first["tokens"].append(99)  # a comparison that changes what it was given
    assert judge.expected_outputs(exercise, 0) == {"tokens": [1, 2, 3]} and len(runs) == 1
    judge.expected_outputs(exercise, 1)
    assert len(runs) == 2  # another seed, other inputs
    for seed in range(2, 2 + judge._RECENT):
        judge.expected_outputs(exercise, seed)
    judge.expected_outputs(exercise, 0)
    assert len(runs) == 3 + judge._RECENT  # only the last few are kept: seed 0 was computed again


def test_a_lab4_demo_cell_waits_for_its_exercise_by_number(capsys):
    def serving_metrics(trace, slo):
        return {"ttft_ms": 0.0, "tpot_ms": 0.0, "itl_ms": 0.0, "goodput": 0.0}

    namespace = {"passed": passed, "serving_metrics": serving_metrics}
    exec("result = passed('lab4.serving_metrics')", namespace)
    assert namespace["result"] is False
    assert "skipped until exercise 3 passes" in capsys.readouterr().out


@pytest.mark.parametrize("lab", EACH_LAB)
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
    assert f"({exercises} exercise{'' if exercises == 1 else 's'})" in intro
    assert abs(int(match.group(1)) - (12 * exercises + 10)) <= 5
