"""A class graded in shards adds up to one run: same reports, and every way of faking the sum is refused.

One test grades a small `demo` class (no model needed) once in one run and once as three shards,
the first its own `python -m labkit.cli grade` process (as a CI job's shard is), the other two in this
process after the single run (a process start and an import of torch less each), and compares the merged
reports with the single run's. The refusals are checked on shard folders written from hand-made grades, without a kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest

import labkit
from labkit.cli import main
from labkit.grading import sandbox
from labkit.grading.grader import GradeSettings, SubmissionGrade
from labkit.grading.reports import write_reports
from labkit.grading.result import CheckResult
from labkit.grading.shards import MergeError, Shard, merge_shards, parse_shard, run_info, shard_of

FIXTURES = Path(__file__).parent / "fixtures" / "grading"
SOLVED = FIXTURES / "source" / "demo_basics.ipynb"
# Every cell of these notebooks ends well inside a second; none hangs, so no verdict races a timer.
GRADE_OPTIONS = ["--lab", "demo", "--cell-timeout", "30", "--total-timeout", "300", "--seed", "7"]
# name -> (the solved notebook's code to replace, what replaces it); names chosen to fill all three shards
CLASS = {
    "solved": None,
    "learner": FIXTURES / "demo_basics.ipynb",
    "overflows": ("shifted = x - x.max(dim=-1, keepdim=True).values", "shifted = x"),
    "wrong_tokens": ("logits.argmax(dim=-1)", "logits.argmin(dim=-1)"),
    "broken": FIXTURES / "broken.ipynb",
}


def write_class(folder: Path) -> list[str]:
    folder.mkdir()
    paths = []
    for name, how in CLASS.items():
        path = folder / f"{name}.ipynb"
        if isinstance(how, Path):
            path.write_text(how.read_text())
        else:
            notebook = nbformat.read(SOLVED, as_version=4)
            for cell in notebook.cells:
                cell.source = cell.source.replace(*how) if how else cell.source
            nbformat.write(notebook, path)
        paths.append(str(path))
    return paths


def sandbox_option() -> list[str]:
    return ["--no-sandbox"] if sandbox.sandbox_problem() else []


@pytest.fixture(scope="module")
def one_run_and_shards(tmp_path_factory):
    """Grade the class in one run and as three shards: shard 1 in a process of its own while this one grades the
    whole class, then shards 2 and 3 here."""
    folder = tmp_path_factory.mktemp("shards")
    paths = write_class(folder / "class")
    assert {shard_of(Path(path).stem, 3) for path in paths} == {1, 2, 3}  # every shard has work
    env = {**os.environ, "LABKIT_CACHE": str(folder / "cache")}  # the demo lab needs no model
    first_shard = subprocess.Popen(
        [sys.executable, "-m", "labkit.cli", "grade", *paths, "--out", str(folder / "shard1")]
        + [*GRADE_OPTIONS, "--shard", "1/3", *sandbox_option()],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LABKIT_CACHE", str(folder / "cache"))
        assert (
            main(["grade", *paths, "--out", str(folder / "one"), *GRADE_OPTIONS, "--jobs", "2", *sandbox_option()]) == 0
        )
        for k in (2, 3):
            assert (
                main(
                    ["grade", *paths, "--out", str(folder / f"shard{k}"), *GRADE_OPTIONS, "--shard", f"{k}/3"]
                    + sandbox_option()
                )
                == 0
            )
    output, _ = first_shard.communicate()
    assert first_shard.returncode == 0, output
    shards = [folder / f"shard{k}" for k in (1, 2, 3)]
    assert main(["grade", "merge", *map(str, shards), "--out", str(folder / "merged")]) == 0
    return folder / "one", folder / "merged", shards


def without_times(report: dict) -> dict:
    return {key: value for key, value in report.items() if key != "elapsed_s"}


def junit_without_times(path: Path) -> bytes:
    tree = ET.parse(path)
    for suite in tree.iter("testsuite"):
        suite.attrib.pop("time")
    return ET.tostring(tree.getroot())


def test_merged_shards_equal_one_run(one_run_and_shards):
    one, merged, shards = one_run_and_shards
    graded = [json.loads((shard / "run.json").read_text())["graded"] for shard in shards]
    assert sorted(sum(graded, [])) == sorted(CLASS) and all(graded)  # each submission in one shard
    assert (merged / "grades.csv").read_text() == (one / "grades.csv").read_text()
    assert (merged / "similarity.html").read_text() == (one / "similarity.html").read_text()  # the whole class
    for name in CLASS:
        one_report, merged_report = (json.loads((folder / f"{name}.json").read_text()) for folder in (one, merged))
        assert without_times(merged_report) == without_times(one_report), name
        assert (merged / f"{name}.md").read_text() == (one / f"{name}.md").read_text(), name
        assert junit_without_times(merged / f"{name}.xml") == junit_without_times(one / f"{name}.xml"), name
    scores = {name: json.loads((one / f"{name}.json").read_text())["score"] for name in CLASS}
    assert scores == {"solved": 4, "learner": 0, "overflows": 2, "wrong_tokens": 3, "broken": 0}
    merged_run = json.loads((merged / "run.json").read_text())
    assert merged_run["graded"] == list(CLASS) and [m["shard"] for m in merged_run["merged_from"]] == [
        "1/3",
        "2/3",
        "3/3",
    ]


def test_shard_names_are_stable_and_the_option_is_checked():
    assert shard_of("alice_lab2", 3) == shard_of("alice_lab2", 3)
    assert {shard_of(f"learner{i}", 3) for i in range(30)} == {1, 2, 3}
    assert parse_shard("2/3") == Shard(2, 3)
    for bad in ("0/3", "4/3", "2", "a/b", "-1/3"):
        with pytest.raises(ValueError, match="write K/N with 1 <= K <= N"):
            parse_shard(bad)


# ---- refusals, on shard folders written from hand-made grades ----

NAMES = [f"learner{i}" for i in range(9)]
SETTINGS = GradeSettings(lab="demo")


def made_grade(name: str) -> SubmissionGrade:
    points = float(len(name) % 2)
    result = CheckResult(bool(points), points, f"verdict for {name}", "demo.add", "pass" if points else "fail", 1.0)
    return SubmissionGrade(name=name, path=f"class/{name}.ipynb", lab="demo", seed=1, results=[result])


def write_shard(folder: Path, shard: Shard, names=NAMES, graded=None, settings=SETTINGS) -> Path:
    graded = graded if graded is not None else [name for name in names if shard_of(name, shard.count) == shard.index]
    write_reports([made_grade(name) for name in graded], folder, run_info(settings, None, shard, names, graded))
    return folder


@pytest.fixture
def three_shards(tmp_path):
    return [write_shard(tmp_path / f"shard{k}", Shard(k, 3)) for k in (1, 2, 3)]


def test_merging_written_shards_gives_the_one_run_reports(tmp_path, three_shards):
    merge_shards(three_shards, tmp_path / "merged")
    write_shard(tmp_path / "one", Shard())
    for name in ["grades.csv", *(f"{name}{suffix}" for name in NAMES for suffix in (".json", ".xml", ".md"))]:
        assert (tmp_path / "merged" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name


def test_a_missing_shard_is_refused(tmp_path, three_shards):
    with pytest.raises(MergeError, match="shard 2/3 is missing: grade it \\(--shard 2/3\\)"):
        merge_shards([three_shards[0], three_shards[2]], tmp_path / "merged")


def test_a_shard_given_twice_is_refused(tmp_path, three_shards):
    with pytest.raises(MergeError, match="shard 1/3 is given twice"):
        merge_shards([three_shards[0], *three_shards], tmp_path / "merged")


def test_a_report_edited_after_the_run_is_refused(tmp_path, three_shards):
    report = next(three_shards[1].glob("learner*.json"))
    report.write_text(json.dumps({**json.loads(report.read_text()), "score": 9}))
    with pytest.raises(MergeError, match=f"{report.name} is missing or was changed after the run"):
        merge_shards(three_shards, tmp_path / "merged")
    (three_shards[2] / "checksums.json").unlink()
    with pytest.raises(MergeError, match="has no checksums.json"):
        merge_shards([three_shards[2]], tmp_path / "merged")


def test_a_shard_of_another_lab_or_labkit_is_refused(tmp_path, three_shards, monkeypatch):
    other_lab = write_shard(tmp_path / "other_lab", Shard(3, 3), settings=GradeSettings(lab="lab2"))
    with pytest.raises(MergeError, match="another lab and settings"):
        merge_shards([*three_shards[:2], other_lab], tmp_path / "merged")
    monkeypatch.setattr(labkit, "__version__", "9.9.9")
    other_version = write_shard(tmp_path / "other_version", Shard(3, 3))
    with pytest.raises(MergeError, match="another labkit version"):
        merge_shards([*three_shards[:2], other_version], tmp_path / "merged")


def test_a_submission_in_two_shards_or_in_none_is_refused(tmp_path, three_shards):
    stolen = next(name for name in NAMES if shard_of(name, 3) == 1)
    mine = [name for name in NAMES if shard_of(name, 3) == 2]
    doubled = write_shard(tmp_path / "doubled", Shard(2, 3), graded=[*mine, stolen])
    with pytest.raises(MergeError, match=f"submission {stolen} appears in two shards"):
        merge_shards([three_shards[0], doubled, three_shards[2]], tmp_path / "merged")
    late = next(f"late{i}" for i in range(99) if shard_of(f"late{i}", 3) == 2)
    rerun = write_shard(tmp_path / "rerun3", Shard(3, 3), names=[*NAMES, late])  # only shard 3 was re-run
    with pytest.raises(MergeError, match=f"submission {late} .* was graded by no shard: re-run shard 2/3"):
        merge_shards([*three_shards[:2], rerun], tmp_path / "merged")


def test_merge_on_the_command_line_names_the_problem(tmp_path, three_shards, capsys):
    assert main(["grade", "merge", str(three_shards[0]), "--out", str(tmp_path / "merged")]) == 2
    assert "shards 2/3, 3/3 are missing" in capsys.readouterr().out
    assert main(["grade", "merge", "--out", str(tmp_path / "merged")]) == 2
    assert "needs the shards' output folders" in capsys.readouterr().out
    assert main(["grade", str(FIXTURES / "empty.ipynb"), "--out", str(tmp_path), "--shard", "3/2"]) == 2
    assert "--shard 3/2: write K/N" in capsys.readouterr().out


def test_only_the_bare_word_merge_is_the_subcommand(tmp_path, capsys):
    """`./merge` and `merge/NAME.ipynb` are submissions to grade (here refused for the shard), not a merge."""
    for first in ("./merge", "merge/lab2.ipynb"):
        assert main(["grade", first, "--out", str(tmp_path), "--shard", "3/2"]) == 2
        assert "--shard 3/2: write K/N" in capsys.readouterr().out
