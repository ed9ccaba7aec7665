"""Hint counts in grades: recorded per exercise, free by default, weighed only when an instructor asks."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import nbformat
import pytest

from labkit.cli import main
from labkit.grading import hint_counts, sandbox
from labkit.grading.hint_counts import read_hint_counts, weigh_hints
from labkit.grading.kernel_side import save_hint_counts
from labkit.grading.result import CheckResult

FIXTURES = Path(__file__).parent / "fixtures" / "grading"


def result(passed: bool = True, points: float = 2.0) -> CheckResult:
    return CheckResult(passed, points if passed else 0.0, "msg", "lab4.preemption", "pass" if passed else "fail", 2.0)


def test_hints_are_recorded_and_cost_nothing_by_default():
    weighed = weigh_hints(result(), 3)
    assert weighed.hints_shown == 3 and weighed.points == 2.0
    assert weighed.to_dict()["hints_shown"] == 3


def test_a_penalty_takes_its_fraction_of_the_points_per_hint_and_never_goes_below_zero():
    assert weigh_hints(result(), 2, penalty=0.1).points == pytest.approx(1.6)
    assert weigh_hints(result(), 30, penalty=0.1).points == 0.0
    assert weigh_hints(result(), 0, penalty=0.1).points == 2.0


def test_a_failed_exercise_loses_nothing_more_for_its_hints():
    assert weigh_hints(result(passed=False), 2, penalty=0.5).points == 0.0


def test_the_kernel_writes_this_kernels_counts(tmp_path, monkeypatch):
    monkeypatch.setattr(hint_counts, "_shown", {"lab4.preemption": 2})
    save_hint_counts(str(tmp_path / "hints.json"))
    assert read_hint_counts(tmp_path / "hints.json") == {"lab4.preemption": 2}


@pytest.mark.parametrize(
    "content, counts",
    [
        ("not json", {}),
        ("[1, 2]", {}),
        ('{"a": -1, "b": "3", "c": true, "d": 2, "e": 10000}', {"d": 2, "e": 99}),
    ],
)
def test_a_malformed_count_file_counts_as_no_hints(tmp_path, content, counts):
    (tmp_path / "hints.json").write_text(content)
    assert read_hint_counts(tmp_path / "hints.json") == counts
    assert read_hint_counts(tmp_path / "absent.json") == {}


def test_a_count_file_the_kernel_turned_into_a_trap_counts_as_no_hints(tmp_path):
    """A FIFO with no writer would block an open() for ever; a sparse file would fill the grader's memory."""
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    (tmp_path / "real.json").write_text('{"a": 1}')
    with open(tmp_path / "sparse.json", "wb") as file:
        file.truncate(1 << 40)  # a terabyte that takes no disk
    read = {}
    reader = threading.Thread(
        target=lambda: read.update({n: read_hint_counts(tmp_path / f"{n}.json") for n in ("fifo", "link", "sparse")})
    )
    reader.start()
    reader.join(timeout=30)
    assert not reader.is_alive(), "reading the hint file blocked"
    assert read == {"fifo": {}, "link": {}, "sparse": {}}


def test_an_out_of_range_penalty_is_refused(tmp_path, capsys):
    code = main(["grade", str(FIXTURES / "empty.ipynb"), "--out", str(tmp_path), "--hint-penalty", "2"])
    assert code == 2 and "--hint-penalty must be between 0" in capsys.readouterr().out


def grade_with_hints(tmp_path: Path, *options: str) -> dict:
    """Grade the solved demo notebook with labkit.hint("demo.add") called twice (its one tier, shown once)."""
    notebook = nbformat.read(FIXTURES / "source" / "demo_basics.ipynb", as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell('import labkit\nlabkit.hint("demo.add")\nlabkit.hint("demo.add")'))
    tmp_path.mkdir()
    path = tmp_path / "asked.ipynb"
    nbformat.write(notebook, path)
    out = tmp_path / "grades"
    no_sandbox = ["--no-sandbox"] if sandbox.sandbox_problem() else []
    with pytest.MonkeyPatch.context() as patch:  # the demo lab needs no model
        patch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
        code = main(
            ["grade", str(path), "--out", str(out), "--lab", "demo", "--cell-timeout", "30", *no_sandbox, *options]
        )
    assert code == 0
    return json.loads((out / "asked.json").read_text())


def test_the_grader_reports_the_hints_a_notebook_showed_and_weighs_them_when_asked(tmp_path):
    plain = grade_with_hints(tmp_path / "plain")
    shown = {exercise["id"]: exercise["hints_shown"] for exercise in plain["exercises"]}
    assert shown == {"demo.add": 1, "demo.softmax": 0, "demo.greedy_tokens": 0}
    assert plain["score"] == plain["max_score"]
    weighed = grade_with_hints(tmp_path / "weighed", "--hint-penalty", "0.5")
    add = next(exercise for exercise in weighed["exercises"] if exercise["id"] == "demo.add")
    assert add["points"] == pytest.approx(add["max_points"] * 0.5)
    assert weighed["score"] == pytest.approx(weighed["max_score"] - add["max_points"] * 0.5)
