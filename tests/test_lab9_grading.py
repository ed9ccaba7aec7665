"""``labkit grade`` grades lab 9: the solved exercises earn every point, the handed-out ones none.

The grader runs a submission's cells in a sandboxed kernel, then asks it for each exercise's
outputs on inputs from its own secret seed. The notebooks graded here keep lab 9's setup,
exercise and check cells and leave out the demo cells that start ``labkit serve`` and load
it with the default model: those take minutes, and no check depends on them (see
test_lab9_sandbox for the loopback they need). A full graded run of both notebooks, demo
cells included, is described in the README.
"""

import json
from pathlib import Path

import nbformat
import pytest

from labkit.cli import main
from labkit.grading import sandbox

pytestmark = pytest.mark.lab9
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = {
    "solved": ROOT / "labs" / "source" / "lab9_serving.ipynb",
    "handed_out": ROOT / "labs" / "lab9_serving.ipynb",
}


def exercises_only(path: Path) -> nbformat.NotebookNode:
    """The notebook's first code cell (its imports) and every exercise and check cell."""
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    tagged = [
        cell for cell in code if any(t.startswith(("exercise:", "check:")) for t in cell.metadata.get("tags", []))
    ]
    notebook.cells = [code[0], *tagged]
    return notebook


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lab9-class")
    paths = []
    for name, source in NOTEBOOKS.items():
        paths.append(folder / f"{name}.ipynb")
        nbformat.write(exercises_only(source), paths[-1])
    out = folder / "grades"
    with pytest.MonkeyPatch.context() as patch:  # these cells need no default model: keep the machine's cache out
        patch.setenv("LABKIT_CACHE", str(folder / "cache"))
        runs = [paths] if not sandbox.sandbox_problem() else [[path] for path in paths]  # one at a time unsandboxed
        for batch in runs:
            flags = ["--no-sandbox"] if sandbox.sandbox_problem() else []
            assert main(["grade", *map(str, batch), "--out", str(out), "--cell-timeout", "120", *flags]) == 0
    return {name: json.loads((out / f"{name}.json").read_text()) for name in NOTEBOOKS}


def test_the_solved_lab_gets_every_point(graded):
    report = graded["solved"]
    assert report["lab"] == "lab9" and report["error"] is None
    assert {e["id"]: e["status"] for e in report["exercises"]} == {
        "lab9.engine_turn": "pass",
        "lab9.dashboard": "pass",
        "lab9.highest_rate": "pass",
    }
    assert report["score"] == report["max_score"] == 6.0


def test_the_handed_out_lab_gets_none_and_is_told_what_to_do(graded):
    report = graded["handed_out"]
    assert report["score"] == 0.0 and report["max_score"] == 6.0
    assert all(e["status"] == "not_done" for e in report["exercises"])
    assert all("NotImplementedError" in e["message"] for e in report["exercises"])
