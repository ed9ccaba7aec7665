"""Learner text in the grader's reports is data: bounded, unable to forge structure, safe in a spreadsheet.

Each test builds the grade a hostile submission would get (its exception messages and
notes are its own text) and checks the reports written from it, without running a kernel.
"""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ET

import nbformat
import pytest
from markdown_it import MarkdownIt  # installed with jupyter-book (the book extra)

from labkit.grading.grader import SubmissionGrade, class_summary, kernel_env
from labkit.grading.hint_counts import self_reported
from labkit.grading.report_text import MAX_TEXT_BYTES, code_block, csv_cell, report_text
from labkit.grading.reports import write_reports
from labkit.grading.result import CheckResult
from labkit.grading.submissions import MAX_NAME_CHARS, SubmissionError, infer_lab, rename_note, submission_names


def hostile_grade(message: str, name: str = "attacker", notes: list[str] | None = None) -> SubmissionGrade:
    result = CheckResult(False, 0.0, f"ERROR demo.add\nProblem: {message}", "demo.add", "error", 1.0)
    return SubmissionGrade(name=name, path=f"{name}.ipynb", lab="demo", seed=1, results=[result], notes=notes or [])


def honest_grade() -> SubmissionGrade:
    result = CheckResult(True, 1.0, "PASS demo.add", "demo.add", "pass", 1.0)
    return SubmissionGrade(name="honest", path="honest.ipynb", lab="demo", seed=2, results=[result])


def headings(markdown: str) -> list[str]:
    """The headings a CommonMark renderer makes of `markdown`."""
    tokens = MarkdownIt().parse(markdown)
    return [inline.content for opening, inline in zip(tokens, tokens[1:]) if opening.type == "heading_open"]


def test_a_message_cannot_close_its_block_and_forge_headings(tmp_path):
    """Issue 51.1: not for a renderer, and not for a reader that goes line by line (no line starts with `#`)."""
    forged = "boom\n```\n# attacker: 1 / 1 points\n````\n## Feedback\n~~~\n   # three spaces\n<!--\n"
    write_reports([hostile_grade(forged, notes=[forged])], tmp_path)
    markdown = (tmp_path / "attacker.md").read_text()
    assert headings(markdown) == [
        "attacker: 0 / 1 points",
        "Feedback",
        "`demo.add`: ERROR",
        "Notes",
    ], markdown
    assert [line for line in markdown.splitlines() if line.startswith(("#", " #", "  #", "   #"))] == [
        "# attacker: 0 / 1 points",
        "## Feedback",
        "### `demo.add`: ERROR",
        "## Notes",
    ]
    blocks = [token.content for token in MarkdownIt().parse(markdown) if token.type == "code_block"]
    assert forged in blocks[0] and forged in blocks[1]  # shown verbatim, as data


def test_every_line_of_a_code_block_is_indented_four_spaces():
    assert code_block("plain") == ["    plain"]
    assert code_block("a\n\n# b") == ["    a", "    ", "    # b"]


def test_giant_messages_are_cut_and_every_report_stays_within_the_bound(tmp_path):
    giant = "x" * (3 * MAX_TEXT_BYTES)
    write_reports([hostile_grade(giant, notes=[giant] * 50), honest_grade()], tmp_path)
    bound = 4 * MAX_TEXT_BYTES  # one message and the notes, each at most MAX_TEXT_BYTES, twice in the XML
    for suffix in (".json", ".xml", ".md"):
        assert (tmp_path / f"attacker{suffix}").stat().st_size < bound, suffix
    report = json.loads((tmp_path / "attacker.json").read_text())
    message = report["exercises"][0]["message"]
    assert len(message.encode()) <= MAX_TEXT_BYTES and message.endswith("bytes cut")
    assert report["notes"][-1].endswith("more cut") and len(report["notes"]) < 50
    assert json.loads((tmp_path / "honest.json").read_text())["score"] == 1


def test_the_cut_says_how_much_was_cut():
    text = report_text("é" * 1000, limit=200)
    kept, cut = text.rsplit("\n… ", 1)
    assert len(text.encode()) <= 200 and cut.endswith(" bytes cut")
    assert len(kept.encode()) + int(cut.split()[0]) == 2000


def test_unprintable_text_cannot_break_the_xml_or_the_file_encoding(tmp_path):
    write_reports([hostile_grade("nul \x00 escape \x1b lone \ud800 end"), honest_grade()], tmp_path)
    case = ET.parse(tmp_path / "attacker.xml").getroot().find("testsuite/testcase/failure")
    assert "nul \\u0000 escape \\u001b lone \\ud800 end" in case.text
    assert "lone \\ud800" in (tmp_path / "attacker.md").read_text()


def test_no_cell_of_grades_csv_can_start_a_formula(tmp_path):
    grade = hostile_grade("x", name="-cmd")
    grade.error = '=HYPERLINK(CONCAT("http:","//evil"),"open grades")'
    write_reports([grade, honest_grade()], tmp_path)
    with (tmp_path / "grades.csv").open() as file:
        rows = list(csv.reader(file))
    cells = [cell for row in rows for cell in row]
    assert not [cell for cell in cells if cell.startswith(("=", "+", "-", "@", "\t", "\r"))]
    assert "'-cmd" in cells and "'" + grade.error in cells
    assert [csv_cell(value) for value in ("@SUM(A1)", "\tx", "plain", "3")] == ["'@SUM(A1)", "'\tx", "plain", "3"]


def test_report_names_are_unique_and_safe_whatever_the_submissions_are_called(tmp_path):
    called = ["checksums", "grades", "Alice", "alice", "..", ".hidden", "x" * 300, "x" * 299 + "y"]
    names = submission_names([tmp_path / f"{stem}.ipynb" for stem in called])
    assert names[:6] == ["checksums_submission", "grades_submission", "Alice", "alice_again", "submission", "hidden"]
    assert len({name.casefold() for name in names}) == len(names)
    assert all(len(name) <= MAX_NAME_CHARS for name in names) and names[6] != names[7]


def test_a_submission_called_checksums_keeps_its_report_and_the_manifest_its_name(tmp_path):
    (name,) = submission_names([tmp_path / "checksums.ipynb"])
    grade = hostile_grade("x", name=name)
    manifest, _ = write_reports([grade, honest_grade()], tmp_path)
    files = json.loads(manifest.read_text())["files"]
    assert manifest.name == "checksums.json" and "checksums.json" not in files
    assert json.loads((tmp_path / f"{name}.json").read_text())["submission"] == name


def test_a_submission_named_like_a_run_file_in_full_is_renamed_and_told_so(tmp_path):
    """Issue 51.2: `grades.csv.ipynb` would give `grades.csv.md`; the rename is said in its report and the summary."""
    paths = [tmp_path / name for name in ("grades.csv.ipynb", "RUN.ipynb", "alice.ipynb")]
    names = submission_names(paths)
    assert names == ["grades.csv_submission", "RUN_submission", "alice"]
    notes = [rename_note(path, name) for path, name in zip(paths, names)]
    assert notes[0] == (
        "handed in as 'grades.csv.ipynb'; its reports are named grades.csv_submission: the grader writes "
        "checksums.json, grades.csv, run.json, similarity.html, similarity.json itself"
    )
    assert notes[2] is None and rename_note(tmp_path / "a" / "lab2.ipynb", "a__lab2") is None  # only reserved names
    grades = [hostile_grade("x", name=name) for name in names]
    for grade, path in zip(grades, paths):
        grade.path = str(path)
    summary = class_summary(grades)
    assert summary.endswith("itself: 'grades.csv.ipynb' as grades.csv_submission, 'RUN.ipynb' as RUN_submission")


def test_the_summary_says_hint_counts_are_self_reported_when_they_cost_points():
    """Issue 51.4: the counts come from the learner's kernel, which no grader can audit."""
    assert "self-reported" not in class_summary([honest_grade()])
    assert class_summary([honest_grade()], 0.1).endswith(self_reported(0.1))
    assert "--hint-penalty 0.1: the hint counts are self-reported" in self_reported(0.1)


def test_a_lab_named_in_metadata_must_look_like_a_lab_id():
    notebook = nbformat.v4.new_notebook(metadata={"labkit": {"lab": "lab2\n# forged: 4 / 4"}})
    with pytest.raises(SubmissionError, match="no lab's id; pass --lab"):
        infer_lab(notebook)


def test_the_run_summary_counts_the_submissions_it_could_not_grade():
    refused = hostile_grade("x", name="deep")
    refused.error = "deep.ipynb is not a readable Jupyter notebook"
    assert class_summary([honest_grade()]) == "1 of 1 submissions graded"
    summary = class_summary([honest_grade(), refused])
    assert summary.startswith("1 of 2 submissions graded; 1 could not be") and summary.endswith(": deep")
    assert refused.to_dict()["status"] == "not_graded" and honest_grade().to_dict()["status"] == "graded"


def test_a_kernel_gets_only_allow_listed_variables(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "DATABASE_URL", "GH_PAT", "DEPLOY_SSH_KEY", "NPM_AUTH", "CI_JOB_JWT"):
        monkeypatch.setenv(name, "hidden")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    env = kernel_env(sandboxed=True)
    assert "hidden" not in env.values()
    assert env["OMP_NUM_THREADS"] == "2" and env["LC_ALL"] == "C.UTF-8" and "PATH" in env
