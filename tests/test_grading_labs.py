"""``labkit grade`` grades the real labs: solved exercises earn every point, through the sandboxed kernel.

The demo grader test uses a toy lab; these make sure labs whose checks run the engine on a
learner's pieces (lab 7's allocator, lab 8's speculation, lab 9's server loop, policy and sweep),
graded with a seed of their own, go through the same path. The submission keeps the notebook's first code
cell (its imports) and its exercise cells: the measurements and the server demos would only cost
time, and no check depends on them (lab 9's checks that start servers run in the sandbox here, on
its loopback). That the handed-out blanks earn nothing, on every lab, is proven through the grader's request
path in test_grading_seeds.py (a blank raises before any oracle is needed), and through the kernel on the demo
lab's learner notebook in test_grading_grader.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from labkit.cli import main
from labkit.grading import sandbox
from labkit.grading.checks import exercises_for_lab
from labkit.labs.manifest import LABS as MANIFEST
from labkit.models import default_model

LABS = Path(__file__).resolve().parents[1] / "labs"
# The labs the manifest says are graded here, end to end: every exercise of each must pass solved.
GRADED = [
    pytest.param(
        lab.stem, {e.id for e in exercises_for_lab(lab.name)}, lab.needs_model, marks=getattr(pytest.mark, lab.name)
    )
    for lab in MANIFEST
    if lab.graded_end_to_end
]


def exercises_only(path: Path) -> nbformat.NotebookNode:
    """The notebook with its first code cell (the imports) and its exercise cells, nothing else."""
    notebook = nbformat.read(path, as_version=4)
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    kept = [cells[0]] + [c for c in cells if any(t.startswith("exercise:") for t in c.metadata.get("tags", []))]
    return nbformat.v4.new_notebook(cells=kept, metadata=notebook.metadata)


def use_model_cache(needs_model: bool, tmp_path: Path, monkeypatch) -> None:
    """A lab whose checks need no default model gets an empty cache, kept apart from the machine's.

    The grader also refuses a model cache whose record has no checksums (one converted by an older
    labkit): then a lab that needs the model converts it afresh into a cache of its own (slow, once).
    """
    if needs_model:
        try:
            default_model.verify_cache(default_model.default_model_dir(), contents=True)
            return
        except default_model.ModelCacheError:
            pass
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("name, exercises, needs_model", GRADED)
def test_solved_exercises_earn_full_marks(name, exercises, needs_model, tmp_path, monkeypatch):
    use_model_cache(needs_model, tmp_path, monkeypatch)
    solved = tmp_path / "solved.ipynb"
    nbformat.write(exercises_only(LABS / "source" / f"{name}.ipynb"), solved)
    out = tmp_path / "grades"
    no_sandbox = ["--no-sandbox"] if sandbox.sandbox_problem() else []
    args = ["grade", str(solved), "--out", str(out), "--cell-timeout", "300", "--seed", "7"]
    assert main(args + no_sandbox) == 0
    report = json.loads((out / "solved.json").read_text())
    assert report["lab"] == name.split("_")[0] and report["error"] is None
    assert {e["id"]: e["status"] for e in report["exercises"]} == dict.fromkeys(exercises, "pass"), report
    assert report["score"] == report["max_score"] > 0
