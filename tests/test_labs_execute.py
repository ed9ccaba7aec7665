"""Every lab runs end to end in a fresh kernel: solved, every check passes; handed out, every check says "not done".

One harness for every lab; each is marked with its lab, so ``pytest -m lab5`` runs lab 5's
notebooks with its checks. Each notebook runs in a fresh kernel (nbclient) from ``labs/``, as a
learner's JupyterLab would run it. That the learner notebooks are what their sources generate
is tested once, in test_grading_make_labs.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

from labkit.grading.steady_client import SteadyNotebookClient
from labkit.labs.manifest import LABS

ROOT = Path(__file__).resolve().parents[1]
CELL_TIMEOUT_S = 600
EACH_LAB = [pytest.param(lab.notebook, marks=getattr(pytest.mark, lab.name), id=lab.name) for lab in LABS]


@pytest.fixture(autouse=True)
def kernel_environment(monkeypatch):
    """The kernel must find this checkout's labkit whether or not it is pip-installed.

    It also runs torch on one thread: on a busy machine (tests in parallel, other jobs) two
    OpenMP threads fighting for two cores made a step over ten times slower, and a timeout is
    not what this test is about. Learners keep torch's default.
    """
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def execute(path: Path) -> nbformat.NotebookNode:
    """Run every cell of the notebook in a fresh kernel started in labs/."""
    notebook = nbformat.read(path, as_version=4)
    SteadyNotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "labs")}}
    ).execute()
    return notebook


def outputs(cell) -> str:
    return "".join(
        output.get("data", {}).get("text/plain", "") or output.get("text", "") for output in cell.get("outputs", [])
    )


def check_verdicts(notebook: nbformat.NotebookNode) -> dict[str, str]:
    """Check id -> the text its check cell displayed; every exercise has a check (some have two)."""
    verdicts, exercises = {}, set()
    for cell in notebook.cells:
        for tag in cell.metadata.get("tags", []):
            if tag.startswith("check:"):
                verdicts[tag.removeprefix("check:")] = outputs(cell).strip()
            elif tag.startswith("exercise:"):
                exercises.add(tag.removeprefix("exercise:"))
    assert exercises and exercises <= set(verdicts), (sorted(exercises), sorted(verdicts))
    return verdicts


def errors(notebook: nbformat.NotebookNode) -> list[str]:
    return [
        f"{output.ename}: {output.evalue}"
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.output_type == "error"
    ]


@pytest.mark.parametrize("name", EACH_LAB)
def test_solved_lab_runs_and_every_check_passes(name):
    notebook = execute(ROOT / "labs" / "source" / name)
    assert not errors(notebook)
    for exercise, text in check_verdicts(notebook).items():
        assert text.startswith("PASS"), f"{exercise}:\n{text}"
    skipped = [outputs(cell) for cell in notebook.cells if "(skipped" in outputs(cell)]
    assert not skipped, skipped


@pytest.mark.parametrize("name", EACH_LAB)
def test_learner_lab_runs_to_the_end_with_checks_not_done(name):
    notebook = execute(ROOT / "labs" / name)
    assert not errors(notebook)
    for exercise, text in check_verdicts(notebook).items():
        assert text.startswith(f"NOT DONE {exercise}"), f"{exercise}:\n{text}"
