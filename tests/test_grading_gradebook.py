"""A run's reports become a Canvas gradebook and per-learner feedback, through a roster checked for every slip.

The report folders are written from hand-made grades (`write_reports`, as a run writes them),
without a kernel: what is tested is the mapping from files to learners, the CSV's exact shape and
each error, never a guess.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.cli import main
from labkit.grading.gradebook import GradebookError, write_gradebook
from labkit.grading.grader import GradeSettings, SubmissionGrade
from labkit.grading.reports import write_reports
from labkit.grading.result import CheckResult
from labkit.grading.roster import RosterError
from labkit.grading.shards import MergeError, Shard, run_info

ADD_FAILS = (
    "FAIL demo.add\nTested: add(a, b) on two random (3, 4) tensors gives their elementwise sum\n"
    "First difference: sum at row 0, column 1: expected 0.5, got 1.5\nHint: Add the two tensors element by element."
)


def result(exercise: str, status: str, points: float, max_points: float, message: str, hints: int = 0):
    return CheckResult(status == "pass", points, message, exercise, status, max_points, hints)


def grades() -> list[SubmissionGrade]:
    return [
        SubmissionGrade(
            "alice",
            "class/alice.ipynb",
            "demo",
            1,
            [result("demo.add", "pass", 1, 1, "PASS demo.add", 2), result("demo.softmax", "pass", 2, 2, "PASS")],
        ),
        SubmissionGrade(
            "bob",
            "class/bob.ipynb",
            "demo",
            2,
            [
                result("demo.add", "fail", 0, 1, ADD_FAILS, 1),
                result("demo.softmax", "not_done", 0, 2, "NOT DONE demo.softmax: write your code ..."),
            ],
        ),
        SubmissionGrade(
            "carol",
            "class/carol.ipynb",
            "demo",
            3,
            [result("demo.add", "not_run", 0, 1, "not graded"), result("demo.softmax", "not_run", 0, 2, "not graded")],
            error="carol.ipynb is not a readable Jupyter notebook (Expecting value)",
        ),
    ]


def write_run(folder: Path, made: list[SubmissionGrade] | None = None, shard: Shard = Shard()) -> Path:
    made = grades() if made is None else made
    names = [grade.name for grade in made]
    write_reports(made, folder, run_info(GradeSettings(lab="demo"), None, shard, names, names))
    return folder


ROSTER = """file,student,id,section,sis_user_id
carol.ipynb,Carol King,1003,B,S3
class/alice.ipynb,"Doe, Alice",1001,A,S1
bob.ipynb,Bob Ray,1002,A,
"""


def write_roster(path: Path, text: str = ROSTER) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "grades")


def test_the_gradebook_is_canvas_shaped_in_roster_order(tmp_path, run_dir):
    book = write_gradebook(run_dir, write_roster(tmp_path / "roster.csv"), tmp_path / "out")
    assert book.csv_path.read_bytes().decode() == (
        "Student,ID,SIS User ID,Section,demo\r\n"
        "Carol King,1003,S3,B,0\r\n"
        '"Doe, Alice",1001,S1,A,3\r\n'
        "Bob Ray,1002,,A,0\r\n"
    )
    assert book.absent == [] and sorted(book.feedback) == ["1001", "1002", "1003"]
    write_gradebook(run_dir, tmp_path / "roster.csv", tmp_path / "named", assignment="Lab 0 (4711)")
    assert (tmp_path / "named" / "gradebook.csv").read_text().splitlines()[
        0
    ] == "Student,ID,SIS User ID,Section,Lab 0 (4711)"


def test_each_learner_gets_status_points_first_difference_and_hint_tier(tmp_path, run_dir):
    book = write_gradebook(run_dir, write_roster(tmp_path / "roster.csv"), tmp_path / "out")
    assert book.feedback["1002"] == tmp_path / "out" / "feedback" / "1002.md"
    assert book.feedback["1002"].read_text() == "\n".join(
        [
            "# demo: Bob Ray (1002)",
            "",
            "**0 / 3 points**",
            "",
            "| Exercise | Result | Points | Hint tier reached |",
            "|---|---|---|---|",
            "| `demo.add` | FAIL | 0 / 1 | 1 |",
            "| `demo.softmax` | NOT DONE | 0 / 2 | 0 |",
            "",
            "## `demo.add`",
            "",
            "    First difference: sum at row 0, column 1: expected 0.5, got 1.5",
            "    ",
            "    Hint: Add the two tensors element by element.",
            "",
            "## `demo.softmax`",
            "",
            "    NOT DONE demo.softmax: write your code ...",
            "",
        ]
    )
    alice = book.feedback["1001"].read_text()
    assert (
        alice.startswith("# demo: Doe, Alice (1001)\n\n**3 / 3 points**")
        and "| `demo.add` | PASS | 1 / 1 | 2 |" in alice
    )
    assert "## `demo" not in alice  # nothing to explain where everything passed
    carol = book.feedback["1003"].read_text()
    assert "could not be graded:\n\n    carol.ipynb is not a readable Jupyter notebook" in carol


@pytest.mark.parametrize(
    "roster, error",
    [
        (ROSTER + "dave.ipynb,Dave,1001,B,\n", "learner 1001 \\(Dave\\) is named twice, in rows 3 and 5"),
        (ROSTER + "bob.ipynb,Bobby Ray,1004,A,\n", "the file bob.ipynb is given in rows 4 and 5"),
        (
            ROSTER + "class/bob.ipynb,Bobby Ray,1004,A,\n",
            "class/bob.ipynb is named by roster rows 4 \\(bob.ipynb\\) and 5",
        ),
        ("\n".join(ROSTER.splitlines()[:3]) + "\n", "1 graded submission\\(s\\) are in no roster row: class/bob.ipynb"),
        ("file,student,id\nbob.ipynb,Bob,1\n", "no column section; the roster needs file, student, id, section"),
        (ROSTER + ",Eve,1005,A,\n", "row 5: file is empty"),
    ],
)
def test_a_roster_that_would_grade_the_wrong_person_is_refused(tmp_path, run_dir, roster, error):
    with pytest.raises(RosterError, match=error):
        write_gradebook(run_dir, write_roster(tmp_path / "roster.csv", roster), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_learner_without_a_submission_is_an_error_unless_zero_is_asked_for(tmp_path, run_dir):
    roster = write_roster(tmp_path / "roster.csv", ROSTER + "erin.ipynb,Erin Hale,1005,B,S5\n")
    with pytest.raises(RosterError, match="1 learner\\(s\\) of the roster have no graded submission: row 5: Erin Hale"):
        write_gradebook(run_dir, roster, tmp_path / "out")
    book = write_gradebook(run_dir, roster, tmp_path / "out", missing_zero=True)
    assert [learner.id for learner in book.absent] == ["1005"]
    assert book.csv_path.read_text().splitlines()[-1] == "Erin Hale,1005,S5,B,0"
    assert "No submission of yours was graded: **0 points**." in book.feedback["1005"].read_text()


def test_a_file_name_two_submissions_share_needs_more_of_its_path(tmp_path):
    twins = [SubmissionGrade(f"{who}__lab", f"class/{who}/lab.ipynb", "demo", 1) for who in ("ann", "ben")]
    run_dir = write_run(tmp_path / "grades", twins)
    roster = write_roster(
        tmp_path / "roster.csv", "file,student,id,section\nlab.ipynb,Ann,1,A\nben/lab.ipynb,Ben,2,A\n"
    )
    with pytest.raises(RosterError, match="row 2: the file lab.ipynb matches 2 submissions .*give more of its path"):
        write_gradebook(run_dir, roster, tmp_path / "out")
    write_roster(roster, "file,student,id,section\nann/lab.ipynb,Ann,1,A\nben/lab.ipynb,Ben,2,A\n")
    assert write_gradebook(run_dir, roster, tmp_path / "out").csv_path.read_text().splitlines()[1:] == [
        "Ann,1,,A,0",
        "Ben,2,,A,0",
    ]


def test_reports_edited_after_the_run_or_a_lone_shard_are_refused(tmp_path, run_dir):
    roster = write_roster(tmp_path / "roster.csv")
    report = run_dir / "bob.json"
    report.write_text(json.dumps({**json.loads(report.read_text()), "score": 3}))
    with pytest.raises(MergeError, match="bob.json is missing or was changed after the run"):
        write_gradebook(run_dir, roster, tmp_path / "out")
    shard = write_run(tmp_path / "shard", shard=Shard(1, 2))
    with pytest.raises(GradebookError, match="holds shard 1/2 only: merge the shards first"):
        write_gradebook(shard, roster, tmp_path / "out")


def test_the_gradebook_on_the_command_line(tmp_path, run_dir, capsys):
    roster = write_roster(tmp_path / "roster.csv", ROSTER + "erin.ipynb,Erin Hale,1005,B,\n")
    argv = ["grade", "gradebook", str(run_dir), "--roster", str(roster), "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    assert "no graded submission: row 5: Erin Hale (erin.ipynb)" in capsys.readouterr().out
    assert main([*argv, "--missing-zero"]) == 0
    out = capsys.readouterr().out
    assert "0 points, no graded submission: Erin Hale (1005, roster row 5)" in out
    assert "gradebook for 4 learners" in out and (tmp_path / "out" / "feedback" / "1005.md").is_file()
    assert main(["grade", "gradebook", str(run_dir), "--out", str(tmp_path / "out")]) == 2
    assert "--roster ROSTER.csv" in capsys.readouterr().out
