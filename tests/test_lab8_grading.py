"""`labkit grade` grades lab 8: its solved exercises earn every point, the handed-out blanks none.

The demo grader test uses a toy lab; this one makes sure a real lab with engine checks and a
random rule, graded with a seed of its own, goes through the same path. The submission keeps
only the lab's import cell and its exercise cells (the measurements would only cost time).
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from labkit.cli import main
from labkit.grading import sandbox
from labkit.grading.learner_notebook import make_learner_notebook
from labkit.models import default_model

pytestmark = pytest.mark.lab8
SOURCE = Path(__file__).resolve().parents[1] / "labs" / "source" / "lab8_speculative_decoding.ipynb"
EXERCISES = {"lab8.propose_ngram", "lab8.accept_greedy", "lab8.rollback", "lab8.accept_sampling"}


def exercises_only(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook with its first code cell (the imports) and its exercise cells, nothing else."""
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    kept = [cells[0]] + [c for c in cells if any(t.startswith("exercise:") for t in c.metadata.get("tags", []))]
    return nbformat.v4.new_notebook(cells=kept, metadata=notebook.metadata)


def verified_model_cache(tmp_path: Path, monkeypatch) -> None:
    """The grader refuses a model cache whose record has no checksums (one converted by an older labkit):
    then this test converts the model afresh into a cache of its own (slow, once) instead of failing on the machine's."""
    try:
        default_model.verify_cache(default_model.default_model_dir(), contents=True)
    except default_model.ModelCacheError:
        monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))


def test_solved_exercises_earn_full_marks_and_blanks_none(tmp_path, monkeypatch):
    verified_model_cache(tmp_path, monkeypatch)
    source = nbformat.read(SOURCE, as_version=4)
    learner = make_learner_notebook(source, "lab8", "source/lab8_speculative_decoding.ipynb")
    paths = []
    for name, notebook in (("solved", source), ("handed_out", learner)):
        path = tmp_path / f"{name}.ipynb"
        nbformat.write(exercises_only(notebook), path)
        paths.append(str(path))
    out = tmp_path / "grades"
    no_sandbox = ["--no-sandbox"] if sandbox.sandbox_problem() else []
    args = ["grade", *paths, "--out", str(out), "--lab", "lab8", "--cell-timeout", "300", "--seed", "7"]
    assert main(args + no_sandbox) == 0
    solved, handed_out = (json.loads((out / f"{name}.json").read_text()) for name in ("solved", "handed_out"))
    assert {e["id"]: e["status"] for e in solved["exercises"]} == dict.fromkeys(EXERCISES, "pass"), solved
    assert solved["score"] == solved["max_score"] > 0
    assert {e["id"]: e["status"] for e in handed_out["exercises"]} == dict.fromkeys(EXERCISES, "not_done")
    assert handed_out["score"] == 0
