"""Lab 11 graded by `labkit grade`: the grader reads each kernel cell's source in its own process, so a cell that
hands in labkit's kernel (its outputs are right) scores 0, and a kernel only Triton's interpreter accepts fails by
name, while the byte count, written honestly, keeps its point."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from labkit.cli import main
from labkit.grading import sandbox
from labkit.kernels.compile_for_gpu import compiler_problem

pytestmark = pytest.mark.lab11

SOLVED = Path(__file__).resolve().parents[1] / "labs" / "source" / "lab11_the_kernel.ipynb"
HANDED_IN_LABKITS = (
    "from labkit.kernels import paged_decode as mine\n\npaged_decode_kernel = mine.paged_decode_kernel\n"
)


@pytest.mark.skipif(bool(compiler_problem()), reason=str(compiler_problem()))
def test_a_borrowed_kernel_scores_zero_and_an_interpreter_only_one_fails_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))  # lab 11's checks need no default model
    notebook = nbformat.read(SOLVED, as_version=4)
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    kept = [cells[0]] + [c for c in cells if any(t.startswith("exercise:") for t in c.metadata.get("tags", []))]
    for cell in kept:
        tags = cell.metadata.get("tags", [])
        if "exercise:lab11.paged_decode" in tags:
            cell.source = HANDED_IN_LABKITS
        if "exercise:lab11.split_kv" in tags:
            cell.source = cell.source.replace(
                "        running_max = new_max\n",
                "        running_max = new_max\n        if index > 100:\n            break\n",
            )
    path = tmp_path / "hostile.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=kept, metadata=notebook.metadata), path)
    out = tmp_path / "grades"
    no_sandbox = ["--no-sandbox"] if sandbox.sandbox_problem() else []
    assert main(["grade", str(path), "--out", str(out), "--cell-timeout", "300", "--seed", "7", *no_sandbox]) == 0
    graded = {e["id"]: e for e in json.loads((out / "hostile.json").read_text())["exercises"]}
    assert graded["lab11.paged_decode"]["points"] == 0, graded["lab11.paged_decode"]
    assert "a kernel cell imports only" in graded["lab11.paged_decode"]["message"]
    assert graded["lab11.split_kv"]["points"] == 0 and "Break" in graded["lab11.split_kv"]["message"]
    assert graded["lab11.decode_bytes"]["status"] == "pass"
