"""`labkit make-labs`: learner notebooks generated from solved sources, and the staleness check."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from labkit.cli import main
from labkit.grading.learner_notebook import SourceError, make_learner_notebook

FIXTURES = Path(__file__).parent / "fixtures" / "grading"
REPO = Path(__file__).resolve().parents[1]


def test_fixture_learner_notebook_is_up_to_date(capsys):
    assert main(["make-labs", "--source", str(FIXTURES / "source"), "--out", str(FIXTURES), "--check"]) == 0
    assert "up to date" in capsys.readouterr().out


@pytest.mark.skipif(not list((REPO / "labs" / "source").glob("*.ipynb")), reason="no lab sources yet")
def test_course_learner_notebooks_are_up_to_date():
    assert main(["make-labs", "--source", str(REPO / "labs" / "source"), "--out", str(REPO / "labs"), "--check"]) == 0


def test_solutions_become_blanks_and_everything_else_is_kept():
    source = nbformat.read(FIXTURES / "source" / "demo_basics.ipynb", as_version=4)
    learner = make_learner_notebook(source, "demo", "source/demo_basics.ipynb")
    assert [cell.id for cell in learner.cells] == [cell.id for cell in source.cells]
    assert learner.metadata["labkit"] == {"lab": "demo", "generated_from": "source/demo_basics.ipynb"}
    text = nbformat.writes(learner)
    assert "BEGIN SOLUTION" not in text and "return a + b" not in text and "shifted.exp()" not in text
    add = next(cell for cell in learner.cells if "exercise:demo.add" in cell.metadata.get("tags", []))
    assert add.source.splitlines()[-2:] == [
        "    # HINT: tensors add element by element with `+`.",
        '    raise NotImplementedError("Exercise demo.add: replace this line with your code")',
    ]
    softmax = next(cell for cell in learner.cells if "exercise:demo.softmax" in cell.metadata.get("tags", []))
    assert "    # Your code here." in softmax.source.splitlines()
    assert any("_Your answer here._" in cell.source for cell in learner.cells if cell.cell_type == "markdown")
    check_cell = next(cell for cell in learner.cells if "check:demo.add" in cell.metadata.get("tags", []))
    assert check_cell.metadata["editable"] is False
    assert all(
        cell.outputs == [] and cell.execution_count is None for cell in learner.cells if cell.cell_type == "code"
    )


def test_a_changed_source_makes_the_learner_notebook_stale(tmp_path, capsys):
    source_dir, out_dir = tmp_path / "source", tmp_path / "labs"
    source_dir.mkdir()
    shutil.copy(FIXTURES / "source" / "demo_basics.ipynb", source_dir)
    assert main(["make-labs", "--source", str(source_dir), "--out", str(out_dir), "--check"]) == 1
    assert "stale: " in capsys.readouterr().out
    assert main(["make-labs", "--source", str(source_dir), "--out", str(out_dir)]) == 0
    assert main(["make-labs", "--source", str(source_dir), "--out", str(out_dir), "--check"]) == 0

    notebook = nbformat.read(source_dir / "demo_basics.ipynb", as_version=4)
    notebook.cells[0].source += "\nA new sentence."
    nbformat.write(notebook, source_dir / "demo_basics.ipynb")
    capsys.readouterr()
    assert main(["make-labs", "--source", str(source_dir), "--out", str(out_dir), "--check"]) == 1
    out = capsys.readouterr().out
    assert f"stale: {out_dir / 'demo_basics.ipynb'} differs" in out and "run `labkit make-labs`" in out


def _one_cell_source(source: str, tags: list[str]) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source, metadata={"tags": tags})])


@pytest.mark.parametrize(
    "source, tags, problem",
    [
        ("### BEGIN SOLUTION\nx = 1", ["exercise:demo.x"], "without a matching END SOLUTION"),
        ("x = 1\n### END SOLUTION", ["exercise:demo.x"], "without a BEGIN SOLUTION"),
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", ["exercise:demo.x"], "inside another"),
        ("### BEGIN SOLUTION\nx = 1\n### END SOLUTION", [], "exactly one tag 'exercise:<id>'"),
        ("x = 1", ["exercise:lab9.x"], "should start with 'demo.'"),
    ],
)
def test_malformed_sources_are_rejected_with_the_cell_named(source, tags, problem):
    with pytest.raises(SourceError, match=problem) as error:
        make_learner_notebook(_one_cell_source(source, tags), "demo", "demo_x.ipynb")
    assert "demo_x.ipynb, cell 1" in str(error.value)


def test_badly_named_source_and_missing_folder_are_clear(tmp_path, capsys):
    assert main(["make-labs", "--source", str(tmp_path / "nowhere"), "--out", str(tmp_path)]) == 2
    assert "no lab source folder" in capsys.readouterr().out
    nbformat.write(_one_cell_source("x = 1", []), tmp_path / "nounderscore.ipynb")
    assert main(["make-labs", "--source", str(tmp_path), "--out", str(tmp_path / "labs")]) == 2
    assert "<lab>_<topic>.ipynb" in capsys.readouterr().out
