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
from hostile_text import ESCAPES, FORGED_FILE_NAME, FORGED_LINE, HOSTILE, raw_learner_text, unprintable
from markdown_it import MarkdownIt  # installed with jupyter-book (the book extra)

from labkit.grading.gradebook import write_gradebook
from labkit.grading.grader import GradeSettings, SubmissionGrade, class_summary, kernel_env
from labkit.grading.gradescope import find_notebook, results_json
from labkit.grading.hint_counts import self_reported
from labkit.grading.report_text import MAX_TEXT_BYTES, code_block, csv_cell, escaped, report_text
from labkit.grading.reports import write_reports
from labkit.grading.result import CheckResult
from labkit.grading.shards import Shard, run_info
from labkit.grading.submissions import (
    MAX_NAME_CHARS,
    SubmissionError,
    infer_lab,
    lab_notes,
    rename_note,
    submission_names,
)


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
    assert "nul \\x00 escape \\x1b lone \\ud800 end" in case.text
    assert "lone \\ud800" in (tmp_path / "attacker.md").read_text()


def test_every_character_isprintable_rejects_is_escaped_visibly_and_only_those():
    assert escaped(HOSTILE).isprintable() and escaped(HOSTILE, keep_newlines=True).split("\n")[1] == FORGED_LINE
    assert escaped("tab\there\r\n\x7f \u00a0 \u200f \u2066 \U000e0001") == (
        "tab\\there\\r\\n\\x7f \\xa0 \\u200f \\u2066 \\U000e0001"
    )
    honest = "FAIL demo.add\nFirst difference: at row 0: expected 0.5, got 1.5 (é, 注意, C:\\path)"
    assert escaped(honest, keep_newlines=True) == honest  # readable text, backslashes included, stays as it is
    assert escaped(escaped(HOSTILE)) == escaped(HOSTILE)  # so every writer may apply it, once more or not


def hostile_class() -> list[SubmissionGrade]:
    """A graded submission whose message, notes and file name are hostile, and one not graded for its file name."""
    graded = hostile_grade(HOSTILE, notes=[HOSTILE])
    graded.path = f"class/{FORGED_FILE_NAME}"
    refused = hostile_grade("x", name="refused")
    refused.path = f"class/refused/{FORGED_FILE_NAME}"
    refused.error = f"{FORGED_FILE_NAME} is not a readable Jupyter notebook ({HOSTILE})"
    return [graded, refused, honest_grade()]


def strings_in(data: object) -> list[str]:
    """Every string in JSON data, keys included."""
    if isinstance(data, str):
        return [data]
    if isinstance(data, dict):
        return [string for key, value in data.items() for string in [key, *strings_in(value)]]
    return [string for value in data for string in strings_in(value)] if isinstance(data, list) else []


def test_no_learner_character_reaches_any_report_raw(tmp_path):
    """Issue 55.4: every file a run, its gradebook and Gradescope's half write, read as text and as data."""
    grades = hostile_class()
    names = [grade.name for grade in grades]
    write_reports(grades, tmp_path / "run", run_info(GradeSettings(lab="demo"), None, Shard(), names, names))
    roster = tmp_path / "roster.csv"
    roster.write_text(
        "file,student,id,section\n"
        + "".join(f"{escaped(grade.path)},{grade.name},{grade.name},A\n" for grade in grades)
    )
    write_gradebook(tmp_path / "run", roster, tmp_path / "book")
    (tmp_path / "results.json").write_text(json.dumps(results_json(grades[0], "output", 1.0)))
    files = [path for path in tmp_path.rglob("*") if path.is_file() and path != roster]
    assert len(files) == 17, files  # 3 x 3 reports, grades.csv, run.json, checksums.json; the gradebook, 3 feedback
    for path in files:  # its text, and each string in it as a JSON reader sees it
        text = path.read_text()
        assert raw_learner_text(text) == [], path
        if path.suffix == ".json":
            assert [unprintable(value) for value in strings_in(json.loads(text)) if unprintable(value)] == [], path
    markdown = (tmp_path / "run" / "attacker.md").read_text()
    assert "boom " in markdown and all(escape in markdown for escape in ESCAPES)  # the honest part stays readable
    report = json.loads((tmp_path / "run" / "attacker.json").read_text())
    assert report["path"] == f"class/x\\n{FORGED_LINE}\\n.ipynb"  # a path is one line
    with (tmp_path / "run" / "grades.csv").open(newline="") as file:
        assert len(list(csv.reader(file))) == len((tmp_path / "run" / "grades.csv").read_text().splitlines()) == 4


def test_no_learner_character_reaches_the_console_raw(tmp_path):
    printed = [class_summary(hostile_class())]
    (tmp_path / "a").mkdir()
    for name in (FORGED_FILE_NAME, f"a/{FORGED_FILE_NAME}"):
        (tmp_path / name).write_text("{}")
    printed.append(find_notebook(tmp_path)[1])  # Gradescope's message naming the notebooks handed in
    printed.append(results_json(hostile_class()[1], "output", 1.0)["tests"][0]["output"])
    for text in printed:
        assert raw_learner_text(text) == [], text


def test_no_cell_of_grades_csv_can_start_a_formula(tmp_path):
    grade = hostile_grade("x", name="-cmd")
    grade.error = '=HYPERLINK(CONCAT("http:","//evil"),"open grades")'
    write_reports([grade, honest_grade()], tmp_path)
    with (tmp_path / "grades.csv").open() as file:
        rows = list(csv.reader(file))
    cells = [cell for row in rows for cell in row]
    assert not [cell for cell in cells if cell.startswith(("=", "+", "-", "@", "\t", "\r"))]
    assert "'-cmd" in cells and "'" + grade.error in cells
    assert [csv_cell(value) for value in ("@SUM(A1)", "\tx", "plain", "3")] == ["'@SUM(A1)", "\\tx", "plain", "3"]


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


def test_a_lab_named_in_metadata_alone_decides_nothing_and_is_shown_escaped():
    notebook = nbformat.v4.new_notebook(metadata={"labkit": {"lab": "lab2\n# forged: 4 / 4" + "x" * 100}})
    with pytest.raises(SubmissionError, match="pass --lab"):
        infer_lab(notebook)
    (note,) = lab_notes(notebook, "demo")
    assert note.startswith("its metadata names the lab 'lab2\\n# forged: 4 / 4xxx") and "\n" not in note


def test_the_run_summary_counts_the_submissions_it_could_not_grade():
    refused = hostile_grade("x", name="deep")
    refused.error = "deep.ipynb is not a readable Jupyter notebook"
    assert class_summary([honest_grade()]) == "1 of 1 submissions graded"
    summary = class_summary([honest_grade(), refused])
    assert summary.startswith("1 of 2 submissions graded; 1 could not be") and summary.endswith(": deep")
    assert refused.to_dict()["status"] == "not_graded" and honest_grade().to_dict()["status"] == "graded"


def test_the_summary_names_the_labs_when_a_run_without_lab_graded_several():
    assert "labs" not in class_summary([honest_grade(), hostile_grade("x")])
    other = hostile_grade("x", name="other")
    other.lab = "lab2"
    summary = class_summary([honest_grade(), hostile_grade("x"), other])
    assert summary.endswith(
        "graded against 2 labs, as their exercise tags say: demo (2), lab2 (1); pass --lab to grade all on one"
    )


def test_a_kernel_gets_only_allow_listed_variables(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "DATABASE_URL", "GH_PAT", "DEPLOY_SSH_KEY", "NPM_AUTH", "CI_JOB_JWT"):
        monkeypatch.setenv(name, "hidden")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    env = kernel_env(sandboxed=True)
    assert "hidden" not in env.values()
    assert env["OMP_NUM_THREADS"] == "2" and env["LC_ALL"] == "C.UTF-8" and "PATH" in env
