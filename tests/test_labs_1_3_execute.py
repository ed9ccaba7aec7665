"""Labs 1-3 run end to end: solved, every check passes; as handed out, every check says "not done".

Each notebook runs in a fresh kernel (nbclient), as a learner's JupyterLab would run it.
The learner notebooks must also be exactly what their sources generate (`labkit make-labs`).
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
LABS = ("lab1_prefill_decode.ipynb", "lab2_kv_cache.ipynb", "lab3_static_batching.ipynb")
CELL_TIMEOUT_S = 600


@pytest.fixture(autouse=True)
def kernels_import_this_labkit(monkeypatch):
    """Kernels inherit PYTHONPATH, so they import this checkout's labkit even without `pip install -e`."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))


def execute(path: Path) -> nbformat.NotebookNode:
    """Run every cell of the notebook in a fresh kernel."""
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return notebook


def check_verdicts(notebook: nbformat.NotebookNode) -> dict[str, str]:
    """Exercise id -> the text the check cell displayed."""
    verdicts = {}
    for cell in notebook.cells:
        for tag in cell.metadata.get("tags", []):
            if tag.startswith("check:"):
                texts = [output.get("data", {}).get("text/plain", "") or output.get("text", "")
                         for output in cell.get("outputs", [])]
                verdicts[tag.removeprefix("check:")] = "".join(texts)
    return verdicts


def error_outputs(notebook: nbformat.NotebookNode) -> list[str]:
    return [f"{output.ename}: {output.evalue}" for cell in notebook.cells if cell.cell_type == "code"
            for output in cell.get("outputs", []) if output.output_type == "error"]


@pytest.mark.parametrize("name", LABS)
def test_solved_lab_runs_and_every_check_passes(name):
    notebook = execute(ROOT / "labs" / "source" / name)
    assert not error_outputs(notebook)
    verdicts = check_verdicts(notebook)
    assert len(verdicts) == 4, verdicts
    for exercise, text in verdicts.items():
        assert text.startswith("PASS"), f"{exercise}:\n{text}"
    skipped = [output.get("text", "") for cell in notebook.cells for output in cell.get("outputs", [])
               if "(skipped:" in output.get("text", "")]
    assert not skipped, skipped


@pytest.mark.parametrize("name", LABS)
def test_learner_lab_runs_to_the_end_with_checks_not_done(name):
    notebook = execute(ROOT / "labs" / name)
    assert not error_outputs(notebook)
    verdicts = check_verdicts(notebook)
    assert len(verdicts) == 4, verdicts
    for exercise, text in verdicts.items():
        assert text.startswith(f"NOT DONE {exercise}"), f"{exercise}:\n{text}"


def test_learner_notebooks_are_what_the_sources_generate():
    from labkit.grading.learner_notebook import learner_text

    for name in LABS:
        generated = learner_text(ROOT / "labs" / "source" / name, ROOT / "labs")
        assert (ROOT / "labs" / name).read_text(encoding="utf-8") == generated, (
            f"labs/{name} is stale: run `labkit make-labs` and commit it")
