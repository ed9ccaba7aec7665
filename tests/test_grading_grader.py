"""`labkit grade` on a class of awkward submissions: each is scored as it deserves.

One grade call covers every submission (kernel starts are slow): a solved notebook,
the generated learner notebook, an empty one, one that hangs, one that ignores the
interrupt, one that kills its kernel, one that tampers, a malformed notebook and a text file.
"""

from __future__ import annotations

import csv
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest
from hostile_text import ESCAPES, FORGED_FILE_NAME, HOSTILE, raw_learner_text

from labkit.cli import main
from labkit.grading import grader as grader_module
from labkit.grading import sandbox
from labkit.grading.grader import kernel_env
from labkit.grading.submissions import SubmissionError, infer_lab, lab_notes, read_notebook, submission_names

pytestmark = pytest.mark.timing  # its verdicts hold on a busy machine: CI proves it with --busy 2

FIXTURES = Path(__file__).parent / "fixtures" / "grading"
EXAMPLE_WORKFLOW = Path(__file__).resolve().parents[1] / "labkit" / "grading" / "examples" / "grade-labs.yml"
# What the timeouts prove, and why these numbers: the hanging cells block for ever (a sleep of
# 30 years), so they reach any limit; every other cell of these notebooks takes well under a second
# on an idle machine, so 30 s leaves them a margin of more than 30x for a busy one. No verdict here
# races a timer: a cell either never ends or ends far inside its limit.
CELL_TIMEOUT_S = 30
TOTAL_TIMEOUT_S = 300
SUBMISSIONS = {  # the slowest first, since three are graded at a time
    "hangs": FIXTURES / "hangs.ipynb",  # waits out two timeouts, so it is the class's critical path
    "ignores_interrupt": FIXTURES / "ignores_interrupt.ipynb",  # one timeout, then the kernel is stopped
    "kills_kernel": FIXTURES / "kills_kernel.ipynb",
    "solved": FIXTURES / "source" / "demo_basics.ipynb",
    "learner": FIXTURES / "demo_basics.ipynb",
    "empty": FIXTURES / "empty.ipynb",
    "tampers": FIXTURES / "tampers.ipynb",
    "broken": FIXTURES / "broken.ipynb",
    "notes": FIXTURES / "notes.txt",
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade all submissions once; return the output folder and each submission's JSON report."""
    folder = tmp_path_factory.mktemp("class")
    out = folder / "grades"
    paths = []
    for name, fixture in SUBMISSIONS.items():
        path = folder / f"{name}{fixture.suffix}"
        path.write_text(fixture.read_text().replace("__OUT_DIR__", str(out)))
        paths.append(str(path))
    with pytest.MonkeyPatch.context() as patch:  # the demo lab needs no model: keep the machine's cache out of it
        patch.setenv("LABKIT_CACHE", str(folder / "cache"))
        code = grade_the_class(paths, out)
    assert code == 0
    reports = {name: json.loads((out / f"{name}.json").read_text()) for name in SUBMISSIONS}
    return out, reports


def grade_the_class(paths, out):
    return main(
        [
            "grade",
            *paths,
            "--out",
            str(out),
            "--lab",
            "demo",
            "--cell-timeout",
            str(CELL_TIMEOUT_S),
            "--total-timeout",
            str(TOTAL_TIMEOUT_S),
            "--jobs",
            "3",
            *(["--no-sandbox"] if sandbox.sandbox_problem() else []),  # this class is about awkward notebooks
        ]
    )


def statuses(report):
    return {exercise["id"]: exercise["status"] for exercise in report["exercises"]}


def test_solved_notebook_gets_full_marks(graded):
    _, reports = graded
    report = reports["solved"]
    assert report["score"] == report["max_score"] == 4
    assert set(statuses(report).values()) == {"pass"} and report["notes"] == [] and report["error"] is None


def test_learner_notebook_runs_to_the_end_and_scores_zero(graded):
    report = graded[1]["learner"]
    assert report["score"] == 0 and report["error"] is None
    assert set(statuses(report).values()) == {"not_done"}


def test_empty_notebook_scores_zero_with_missing_functions(graded):
    report = graded[1]["empty"]
    assert report["score"] == 0 and set(statuses(report).values()) == {"missing"}
    assert "no function named `add`" in report["exercises"][0]["message"]


def test_hanging_cells_are_cut_off_and_the_rest_is_graded(graded):
    report = graded[1]["hangs"]
    assert statuses(report) == {"demo.add": "pass", "demo.softmax": "timeout", "demo.greedy_tokens": "missing"}
    assert report["score"] == 1
    notes = "\n".join(report["notes"])
    assert "cell 2" in notes and "interrupted" in notes


def test_a_cell_that_ignores_the_interrupt_costs_the_kernel_and_the_rest_is_graded(graded):
    """Its own submission, graded beside `hangs`, so the class waits out no more than two timeouts in a row."""
    report = graded[1]["ignores_interrupt"]
    assert statuses(report) == {"demo.add": "pass", "demo.softmax": "missing", "demo.greedy_tokens": "missing"}
    notes = "\n".join(report["notes"])
    assert "cell 3" in notes and "ignored the interrupt, so the kernel was stopped" in notes


def test_killed_kernel_is_restarted_and_the_rest_is_graded(graded):
    report = graded[1]["kills_kernel"]
    assert statuses(report) == {"demo.add": "pass", "demo.softmax": "pass", "demo.greedy_tokens": "crashed"}
    assert report["score"] == 3
    assert any("cell 3" in note and "crashed" in note for note in report["notes"])


def test_tampering_earns_nothing(graded):
    out, reports = graded
    report = reports["tampers"]
    assert report["score"] == 0
    assert statuses(report) == {"demo.add": "fail", "demo.softmax": "error", "demo.greedy_tokens": "error"}
    # The real comparison ran in the grader, though the kernel's compare was patched to pass.
    assert "First difference: sum at row 0, column 0" in report["exercises"][0]["message"]
    assert "not in the grader's format" in report["exercises"][1]["message"]
    assert "could not be loaded safely" in report["exercises"][2]["message"]
    assert not (out / "pwned").exists()
    # The fake report the notebook wrote into the output folder was replaced by the real one.
    assert json.loads((out / "tampers.json").read_text())["score"] == 0


@pytest.mark.parametrize("name", ["broken", "notes"])
def test_unreadable_files_become_error_entries(graded, name):
    report = graded[1][name]
    assert "not a readable Jupyter notebook" in report["error"]
    assert report["score"] == 0 and set(statuses(report).values()) == {"not_run"}


def test_reports_for_ci_people_and_the_class(graded):
    out, reports = graded
    seeds = [report["seed"] for report in reports.values() if report["error"] is None]
    assert len(set(seeds)) == len(seeds) == 7 and None not in seeds  # a secret seed per submission
    with (out / "grades.csv").open() as file:
        rows = {row["submission"]: row for row in csv.DictReader(file)}
    assert set(rows) == set(SUBMISSIONS)
    assert rows["solved"]["demo.softmax"] == "2" and rows["solved"]["total"] == "4"
    assert rows["kills_kernel"]["total"] == "3" and rows["tampers"]["total"] == "0"
    assert "not a readable" in rows["broken"]["error"]

    suite = ET.parse(out / "hangs.xml").getroot().find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "2"
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert cases["demo.add"].find("failure") is None
    assert cases["demo.softmax"].find("failure").get("type") == "timeout"
    broken = ET.parse(out / "broken.xml").getroot().find("testsuite")
    assert broken.get("errors") == "1"

    summary = (out / "kills_kernel.md").read_text()
    assert summary.startswith("# kills_kernel: 3 / 4 points")
    assert "| `demo.greedy_tokens` | CRASHED | 0 / 1 |" in summary


def test_misuse_is_refused_before_any_kernel_starts(tmp_path, capsys):
    notebook = str(FIXTURES / "empty.ipynb")
    assert main(["grade", notebook, "--out", str(tmp_path), "--lab", "lab99"]) == 2
    assert "expected a module labkit.labs.lab99" in capsys.readouterr().out
    assert main(["grade", notebook, "--out", str(tmp_path), "--cell-timeout", "0"]) == 2
    assert main(["grade", notebook, "--out", str(tmp_path), "--jobs", "0"]) == 2
    assert not list(tmp_path.iterdir())


def test_without_a_sandbox_only_one_submission_is_graded_unless_told(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sandbox, "sandbox_problem", lambda: "bwrap not found")
    notebook = str(FIXTURES / "empty.ipynb")
    assert main(["grade", notebook, notebook, "--out", str(tmp_path), "--lab", "demo"]) == 2
    printed = capsys.readouterr().out
    assert "cannot grade 2 submissions together" in printed and "(bwrap not found)" in printed
    assert "apt-get install bubblewrap" in printed and "--no-sandbox" in printed
    assert not list(tmp_path.iterdir())
    assert (
        main(["grade", notebook, "--out", str(tmp_path), "--lab", "demo", "--cell-timeout", str(CELL_TIMEOUT_S)]) == 0
    )
    assert "without a sandbox: bwrap not found" in capsys.readouterr().out
    assert json.loads((tmp_path / "empty.json").read_text())["error"] is None


def test_example_ci_workflow_runs_the_grader():
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load(EXAMPLE_WORKFLOW.read_text())
    steps = workflow["jobs"]["grade"]["steps"]
    commands = " ".join(step.get("run", "") for step in steps)
    assert "labkit grade" in commands and "--out grades" in commands
    assert any(step.get("uses", "").startswith("actions/upload-artifact") for step in steps)


def test_malformed_files_are_described_not_raised(tmp_path):
    cases = {
        "not_json.ipynb": "def add(a, b):",
        "not_a_notebook.ipynb": json.dumps({"a": 1}),
        "cells_not_a_list.ipynb": json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": "x"}),
        "empty_file.ipynb": "",
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(SubmissionError, match=f"{name} is not a readable Jupyter notebook"):
            read_notebook(tmp_path / name)
    with pytest.raises(SubmissionError, match="is not a file"):
        read_notebook(tmp_path)


def tagged_notebook(*tags: str, lab_in_metadata: str | None = None) -> nbformat.NotebookNode:
    cells = [nbformat.v4.new_code_cell("", metadata={"tags": [tag]}) for tag in tags]
    notebook = nbformat.v4.new_notebook(cells=cells)
    if lab_in_metadata:
        notebook.metadata["labkit"] = {"lab": lab_in_metadata}
    return notebook


def test_the_lab_comes_from_the_exercise_tags_never_from_metadata_alone():
    """Issue 55.5: metadata that disagrees is noted; tags naming several labs or none are refused."""
    assert infer_lab(tagged_notebook("exercise:lab2.x", "check:lab3.y", "exercise:lab2.z")) == "lab2"
    assert lab_notes(tagged_notebook("exercise:lab2.x"), "lab2") == []
    disagrees = tagged_notebook("exercise:lab2.x", lab_in_metadata="demo")
    assert infer_lab(disagrees) == "lab2"
    assert lab_notes(disagrees, "lab2") == [
        "its metadata names the lab 'demo'; graded against lab2 (the lab comes from --lab or the exercise tags, "
        "never from metadata)"
    ]
    with pytest.raises(SubmissionError, match=r"no cell is tagged exercise:<lab>.<name>.*; pass --lab"):
        infer_lab(tagged_notebook("exercise:no_dot", "exercise:bad lab.x", lab_in_metadata="demo"))
    with pytest.raises(SubmissionError, match=r"tagged for 2 labs \(demo, lab2\).*; pass --lab"):
        infer_lab(tagged_notebook("exercise:lab2.x", "exercise:demo.add"))
    odd = nbformat.from_dict(
        {"metadata": {"labkit": "lab3"}, "cells": [{"cell_type": "code", "metadata": {"tags": "exercise:lab2.x"}}]}
    )
    with pytest.raises(SubmissionError, match="pass --lab"):
        infer_lab(odd)


def test_with_lab_given_tags_and_metadata_naming_another_are_noted():
    other = tagged_notebook("exercise:lab2.x", lab_in_metadata="lab2")
    assert lab_notes(other, "demo") == [
        "its exercise cells are tagged for lab2; graded against demo, as --lab says",
        "its metadata names the lab 'lab2'; graded against demo (the lab comes from --lab or the exercise tags, "
        "never from metadata)",
    ]


def hostile_demo_notebook() -> nbformat.NotebookNode:
    """The solved demo notebook, its metadata naming lab2, its `add` raising `HOSTILE`."""
    notebook = nbformat.read(FIXTURES / "source" / "demo_basics.ipynb", as_version=4)
    notebook.metadata["labkit"] = {"lab": "lab2"}
    for cell in notebook.cells:
        if "exercise:demo.add" in cell.metadata.get("tags", []):
            cell.source = f"def add(a, b):\n    raise ValueError({HOSTILE!r})"
    return notebook


def test_a_class_run_without_lab_grades_by_tags_and_prints_no_learner_text_raw(tmp_path, capfd):
    """Issues 55.4 and 55.5 in one run without --lab: a forged file name, a hostile message, a notebook whose
    metadata names another lab than its tags, one with no exercise tags and one with two labs' tags."""
    submissions = tmp_path / "class"
    submissions.mkdir()
    (submissions / FORGED_FILE_NAME).write_text("not a notebook")
    nbformat.write(hostile_demo_notebook(), submissions / "hostile.ipynb")
    nbformat.write(tagged_notebook(lab_in_metadata="demo"), submissions / "untagged.ipynb")
    nbformat.write(tagged_notebook("exercise:demo.add", "exercise:lab2.x"), submissions / "two_labs.ipynb")
    out = tmp_path / "grades"
    paths = sorted(str(path) for path in submissions.iterdir())
    args = ["--cell-timeout", str(CELL_TIMEOUT_S), *(["--no-sandbox"] if sandbox.sandbox_problem() else [])]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
        assert main(["grade", *paths, "--out", str(out), *args]) == 0
    printed = capfd.readouterr()
    assert raw_learner_text(printed.out + printed.err) == [], printed
    reports = {
        path.stem: json.loads(path.read_text()) for path in out.glob("*.json") if path.stem not in ("run", "checksums")
    }
    hostile = reports["hostile"]
    assert hostile["lab"] == "demo" and hostile["score"] == 3 and statuses(hostile)["demo.add"] == "error"
    assert any(note.startswith("its metadata names the lab 'lab2'; graded against demo") for note in hostile["notes"])
    assert all(escape in hostile["exercises"][0]["message"] for escape in ESCAPES)
    assert "pass --lab" in reports["untagged"]["error"] and "tagged for 2 labs" in reports["two_labs"]["error"]
    (forged,) = [report for name, report in reports.items() if name.startswith("x_alice")]
    assert "not a readable Jupyter notebook" in forged["error"] and "\n" not in forged["path"]
    for path in out.iterdir():
        assert raw_learner_text(path.read_text()) == [], path


def test_same_file_names_in_different_folders_get_distinct_report_names(tmp_path):
    paths = [tmp_path / "alice" / "lab2.ipynb", tmp_path / "bob" / "lab2.ipynb", tmp_path / "bob" / "lab2.ipynb"]
    assert submission_names(paths) == ["alice__lab2", "bob__lab2", "bob__lab2_again"]
    assert submission_names([tmp_path / "my lab (final).ipynb"]) == ["my_lab_final_"]


def test_kernel_gets_no_secrets_and_this_labkit_first(monkeypatch):
    monkeypatch.setenv("COURSE_API_TOKEN", "hidden")
    monkeypatch.setenv("LABKIT_CACHE", "/tmp/cache")
    monkeypatch.setenv("TMPDIR", "/somewhere/else")
    env = kernel_env()
    assert "COURSE_API_TOKEN" not in env and env["LABKIT_CACHE"] == "/tmp/cache"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(Path(__file__).resolve().parents[1])
    assert "TMPDIR" not in kernel_env(sandboxed=True)  # a sandbox has its own /tmp


def test_prepare_makes_only_the_first_submissions_answers_under_its_seed(monkeypatch):
    """A class of two labs: the checks of both are imported for the judges, but the expected answers made before
    any learner code runs are those the first submission will be handed, its own lab's under its own seed."""
    made = []
    monkeypatch.setattr(grader_module, "expected_outputs", lambda exercise, seed: made.append((exercise.id, seed)))
    monkeypatch.setattr(grader_module, "start_judges", lambda modules: made.append(tuple(modules)))
    grader = grader_module.Grader(grader_module.GradeSettings(sandbox=False), seed=7)
    grader.prepare({"demo", "lab2"}, ("solved", SUBMISSIONS["solved"]))
    seed = grader.seed_for("solved")
    assert made == [(id, seed) for id in ("demo.add", "demo.softmax", "demo.greedy_tokens")] + [
        ("labkit.grading.exercises.demo", "labkit.labs.lab2")
    ]
    assert list(grader._prepared) == [seed] and list(grader._prepared[seed]) == [id for id, _ in made[:3]]
