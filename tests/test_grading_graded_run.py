"""Issue 55.1: in the grader's kernel (LABKIT_GRADING=1) the checks are the grader's: `labkit.check` says so, demo
cells that wait for a check are skipped, a hint is still counted, and an answer in a hidden module is left alone."""

from __future__ import annotations

import sys
import types

import pytest

import labkit
from labkit.grading import evaluate, hint_counts
from labkit.grading.answers import answers_blocked
from labkit.grading.graded_run import GRADED_RUN
from labkit.grading.grader import kernel_env
from labkit.grading.grader_only import STUB
from labkit.labs.common.gate import passed


@pytest.fixture
def graded_run(monkeypatch):
    monkeypatch.setenv(GRADED_RUN, "1")
    monkeypatch.setattr(hint_counts, "_shown", {})


def add(a, b):
    return a + b


def test_every_kernel_the_grader_starts_knows_it_is_graded():
    assert kernel_env(sandboxed=True)[GRADED_RUN] == kernel_env(sandboxed=False)[GRADED_RUN] == "1"


def test_a_check_leaves_the_exercise_to_the_grader(graded_run, capsys):
    labkit.check("demo.add", add)
    assert (
        capsys.readouterr().out.strip() == "(graded run: the grader checks demo.add itself after the notebook has run)"
    )
    result = evaluate("demo.add", add)
    assert result.status == "not_run" and result.points == 0


def test_a_demo_cell_is_skipped(graded_run, capsys):
    assert passed("demo.add") is False
    assert "demo cells that wait for a check are skipped" in capsys.readouterr().out


def test_a_hint_is_shown_where_its_lab_is_there_and_counted_where_it_is_hidden(graded_run, capsys):
    labkit.hint("demo.add")
    assert "Hint 1 of 1 for demo.add" in capsys.readouterr().out
    labkit.hint("hidden.exercise")  # its lab's module is a stub in the sandbox, so no check is registered
    labkit.hint("hidden.exercise")
    assert capsys.readouterr().out.count("hints are not shown here; this one is counted") == 2
    assert hint_counts.hints_shown() == {"demo.add": 1, "hidden.exercise": 2}


def test_outside_the_graded_run_an_unknown_exercise_is_still_an_error(monkeypatch):
    monkeypatch.delenv(GRADED_RUN, raising=False)
    with pytest.raises(ValueError, match="unknown exercise|no exercises are registered"):
        labkit.hint("hidden.exercise")


def test_an_answer_in_a_module_the_sandbox_hides_is_left_alone(monkeypatch):
    stub = types.ModuleType("labkit.grading.exercises.demo", STUB)
    exec(STUB, vars(stub))
    monkeypatch.setitem(sys.modules, "labkit.grading.exercises.demo", stub)
    with answers_blocked("demo.add", ("labkit.grading.exercises.demo.course_add",), (add,)) as (functions, called):
        assert functions == (add,) and functions[0](1, 2) == 3
    assert called == []
