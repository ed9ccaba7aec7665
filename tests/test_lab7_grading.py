"""`labkit grade` grades lab 7: its solved exercises earn every point, the handed-out blanks none.

The demo grader test uses a toy lab; this one makes sure a real lab whose checks run the engine
on the learner's allocator pieces, graded with a seed of its own, goes through the same path. The
submission keeps only the lab's import cell and its exercise cells (the timing cell would only
cost time).
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from labkit.cli import main
from labkit.grading import sandbox
from labkit.grading.learner_notebook import make_learner_notebook

pytestmark = pytest.mark.lab7
SOURCE = Path(__file__).resolve().parents[1] / "labs" / "source" / "lab7_prefix_caching.ipynb"
EXERCISES = {"lab7.block_hashes", "lab7.cached_prefix", "lab7.lru_free"}


def exercises_only(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook with its first code cell (the imports) and its exercise cells, nothing else."""
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    kept = [cells[0]] + [c for c in cells if any(t.startswith("exercise:") for t in c.metadata.get("tags", []))]
    return nbformat.v4.new_notebook(cells=kept, metadata=notebook.metadata)


def test_solved_exercises_earn_full_marks_and_blanks_none(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))  # the checks use the tiny model: no cache needed
    source = nbformat.read(SOURCE, as_version=4)
    learner = make_learner_notebook(source, "lab7", "source/lab7_prefix_caching.ipynb")
    paths = []
    for name, notebook in (("solved", source), ("handed_out", learner)):
        path = tmp_path / f"{name}.ipynb"
        nbformat.write(exercises_only(notebook), path)
        paths.append(str(path))
    out = tmp_path / "grades"
    no_sandbox = ["--no-sandbox"] if sandbox.sandbox_problem() else []
    args = ["grade", *paths, "--out", str(out), "--lab", "lab7", "--cell-timeout", "300", "--seed", "11"]
    assert main(args + no_sandbox) == 0
    solved, handed_out = (json.loads((out / f"{name}.json").read_text()) for name in ("solved", "handed_out"))
    assert {e["id"]: e["status"] for e in solved["exercises"]} == dict.fromkeys(EXERCISES, "pass"), solved
    assert solved["score"] == solved["max_score"] > 0
    assert {e["id"]: e["status"] for e in handed_out["exercises"]} == dict.fromkeys(EXERCISES, "not_done")
    assert handed_out["score"] == 0
