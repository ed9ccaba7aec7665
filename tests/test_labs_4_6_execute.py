"""Labs 4-6 run end to end: solved sources pass every check, learner notebooks reach the end "not done".

Each notebook runs in a fresh kernel (nbclient) from the labs folder, as a learner would run it.
The learner notebooks must also be exactly what their sources generate (not stale).
"""

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from labkit.grading.learner_notebook import learner_text

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "labs"
NOTEBOOKS = ["lab4_continuous_batching.ipynb", "lab5_paged_attention.ipynb", "lab6_chunked_prefill.ipynb"]
CELL_TIMEOUT_S = 600


@pytest.fixture(autouse=True)
def kernel_environment(monkeypatch):
    """The kernel runs in labs/ and must find this checkout's labkit whether or not it is pip-installed.

    It also runs torch on one thread: on a busy machine (tests in parallel, other jobs) two
    OpenMP threads fighting for two cores made a step over ten times slower, and a timeout is
    not what this test is about. Learners keep torch's default.
    """
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def execute(path: Path) -> nbformat.NotebookNode:
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                   resources={"metadata": {"path": str(LABS)}}).execute()
    return notebook


def check_verdicts(notebook: nbformat.NotebookNode) -> dict[str, str]:
    """Check id -> the first line its check cell printed."""
    verdicts = {}
    for cell in notebook.cells:
        ids = [t.removeprefix("check:") for t in cell.metadata.get("tags", []) if t.startswith("check:")]
        if ids:
            texts = [o.get("data", {}).get("text/plain") or o.get("text", "") for o in cell.outputs]
            verdicts[ids[0]] = "".join(texts).strip().splitlines()[0] if any(texts) else ""
    return verdicts


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_learner_notebook_is_generated_from_its_source(name):
    assert (LABS / name).read_text(encoding="utf-8") == learner_text(LABS / "source" / name, LABS), (
        f"labs/{name} is stale: run `labkit make-labs` and commit the result")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_solved_source_passes_every_check(name):
    verdicts = check_verdicts(execute(LABS / "source" / name))
    assert verdicts and all(line.startswith("PASS") for line in verdicts.values()), verdicts


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_learner_notebook_runs_to_the_end_not_done(name):
    verdicts = check_verdicts(execute(LABS / name))
    assert verdicts and all(line.startswith("NOT DONE") for line in verdicts.values()), verdicts
