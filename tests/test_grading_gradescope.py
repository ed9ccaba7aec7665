"""`labkit make-autograder`'s bundle, run as Gradescope runs it, writes results.json in Gradescope's format.

The bundle's `run_autograder` is run on the demo lab's fixture notebooks in folders laid out as
Gradescope lays out /autograder (submission/ in, results/results.json out), each a process of its
own, with the sandbox the grader uses where bubblewrap works here. Its JSON is validated against
the schema below, written from Gradescope's "Autograder Specifications" (the results.json format).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from labkit.cli import main
from labkit.grading import gradescope, sandbox

jsonschema = pytest.importorskip("jsonschema")
pytestmark = pytest.mark.timing  # kernels: its verdicts hold on a busy machine (generous timeouts, no races)

FIXTURES = Path(__file__).parent / "fixtures" / "grading"
VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
FORMAT = {"enum": ["text", "html", "simple_format", "md", "ansi"]}
# Gradescope's results.json: "score" is optional when every test has one; the rest is optional.
GRADESCOPE_RESULTS = {
    "type": "object",
    "additionalProperties": False,
    "anyOf": [{"required": ["score"]}, {"required": ["tests"]}],
    "properties": {
        "score": {"type": "number"},
        "execution_time": {"type": "number"},
        "output": {"type": "string"},
        "output_format": FORMAT,
        "test_output_format": FORMAT,
        "test_name_format": FORMAT,
        "visibility": VISIBILITY,
        "stdout_visibility": VISIBILITY,
        "extra_data": {"type": "object"},
        "tests": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "score": {"type": "number"},
                    "max_score": {"type": "number"},
                    "status": {"enum": ["passed", "failed"]},
                    "name": {"type": "string"},
                    "name_format": FORMAT,
                    "number": {"type": "string"},
                    "output": {"type": "string"},
                    "output_format": FORMAT,
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "visibility": VISIBILITY,
                    "extra_data": {"type": "object"},
                },
            },
        },
        "leaderboard": {
            "type": "array",
            "items": {"type": "object", "required": ["name", "value"], "properties": {"name": {"type": "string"}}},
        },
    },
}
# What this autograder promises beyond the format: every test has these.
TEST_FIELDS = {"name", "score", "max_score", "status", "output", "visibility"}
LAYOUTS = {
    "solved": FIXTURES / "source" / "demo_basics.ipynb",
    "learner": FIXTURES / "demo_basics.ipynb",
    "tampers": FIXTURES / "tampers.ipynb",  # writes a results.json of its own, fakes passes
    "none": None,
}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle")
    argv = ["make-autograder", "demo", "--out", str(out), "--cell-timeout", "30", "--total-timeout", "300"]
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def graded(bundle, tmp_path_factory):
    """Each layout: Gradescope's /autograder with source/ unpacked from the zip and one submission, graded."""
    top = tmp_path_factory.mktemp("gradescope")
    env = {**os.environ, "LABKIT_CACHE": str(top / "cache"), "LABKIT_PYTHON": sys.executable}
    runs = {}
    for name, notebook in LAYOUTS.items():
        root = top / name
        with zipfile.ZipFile(bundle / "autograder.zip") as archive:
            archive.extractall(root / "source")
        (root / "submission").mkdir()
        if notebook:
            text = notebook.read_text().replace("__OUT_DIR__", str(root / "results"))
            (root / "submission" / "lab_demo.ipynb").write_text(text)
        runs[name] = subprocess.Popen(
            ["bash", str(root / "source" / "run_autograder")],
            env={**env, "LABKIT_GRADESCOPE_ROOT": str(root)},
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    results = {}
    for name, process in runs.items():
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, output
        results[name] = json.loads((top / name / "results" / "results.json").read_text())
        assert not (top / name / "results" / "pwned").exists()
    return results


def test_the_bundle_holds_executable_setup_and_run_autograder(bundle):
    with zipfile.ZipFile(bundle / "autograder.zip") as archive:
        modes = {info.filename: info.external_attr >> 16 for info in archive.infolist()}
    assert set(modes) == {"setup.sh", "run_autograder"} and all(mode & stat.S_IXUSR for mode in modes.values())
    run = (bundle / "run_autograder").read_text()
    assert "--lab demo" in run and "--cell-timeout 30 --total-timeout 300" in run
    setup = (bundle / "setup.sh").read_text()
    assert "apt-get install -y bubblewrap" in setup and "labkit.grading.gradescope --lab demo --warm" in setup


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_results_follow_gradescopes_schema(graded, name):
    results = graded[name]
    jsonschema.validate(results, GRADESCOPE_RESULTS)
    assert [test["name"] for test in results["tests"]] == ["demo.add", "demo.softmax", "demo.greedy_tokens"]
    assert all(TEST_FIELDS <= set(test) for test in results["tests"])
    assert results["score"] == sum(test["score"] for test in results["tests"])
    assert [test["max_score"] for test in results["tests"]] == [1, 2, 1]


def test_the_same_judge_gives_the_same_verdicts(graded):
    solved, learner, none = graded["solved"], graded["learner"], graded["none"]
    assert solved["score"] == 4 and {test["status"] for test in solved["tests"]} == {"passed"}
    assert solved["output"].startswith("4 / 4 points on demo")
    assert learner["score"] == 0 and all(test["output"].startswith("NOT DONE") for test in learner["tests"])
    assert none["score"] == 0 and "no notebook (.ipynb) was handed in" in none["output"]
    tampers = graded["tampers"]
    assert tampers["score"] == 0 and [test["status"] for test in tampers["tests"]] == ["failed"] * 3
    assert "First difference: sum at row 0, column 0" in tampers["tests"][0]["output"]
    unsandboxed = "graded without a sandbox" in solved["output"]
    assert unsandboxed == bool(sandbox.sandbox_problem())


def test_an_instructors_mistake_is_no_grade(tmp_path, capsys):
    (tmp_path / "submission").mkdir()
    assert gradescope.main(["--lab", "lab99", "--root", str(tmp_path)]) == 1
    assert "no grade written" in capsys.readouterr().err and not (tmp_path / "results").exists()
    assert main(["make-autograder", "lab99", "--out", str(tmp_path / "bundle")]) == 2
    two = tmp_path / "two"
    (two / "submission" / "old").mkdir(parents=True)
    for where in ("a.ipynb", "old/b.ipynb"):
        (two / "submission" / where).write_text("{}")
    assert gradescope.find_notebook(two / "submission") == (
        None,
        "2 notebooks were handed in (a.ipynb, old/b.ipynb): upload only your lab notebook",
    )
