"""Notebooks import labkit.labs only through its stable surface (labkit.labs.api and the labN spec modules), so
renaming a grader module never breaks a notebook already handed out; every name of that surface resolves."""

import ast
import re
from pathlib import Path

import nbformat
import pytest

import labkit.labs.api as api

LABS = Path(__file__).resolve().parents[1] / "labs"
NOTEBOOKS = sorted(LABS.glob("lab*.ipynb")) + sorted((LABS / "source").glob("lab*.ipynb"))
ALLOWED = re.compile(r"labkit\.labs\.api|labkit\.labs:lab\d+")


def labs_imports(source: str) -> list[str]:
    """``module`` or ``module:name`` for every import of labkit.labs in a cell (magics left out)."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("labkit.labs"):
            found += [node.module if node.module != "labkit.labs" else f"labkit.labs:{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("labkit.labs")]
    return found


def test_the_check_catches_a_notebook_reaching_into_the_grader():
    assert labs_imports("from labkit.labs.common.gate import passed") == ["labkit.labs.common.gate"]
    assert not ALLOWED.fullmatch("labkit.labs.common.gate")
    assert all(ALLOWED.fullmatch(name) for name in labs_imports("from labkit.labs import lab3\nimport labkit.labs.api"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: str(path.relative_to(LABS)))
def test_notebooks_import_only_the_stable_surface_of_labkit_labs(notebook):
    cells = [cell for cell in nbformat.read(notebook, as_version=4).cells if cell.cell_type == "code"]
    outside = sorted({name for cell in cells for name in labs_imports(cell.source) if not ALLOWED.fullmatch(name)})
    assert not outside, (
        f"{notebook.name} imports {outside}: add what it needs to labkit/labs/api.py and import it there"
    )


def test_every_name_of_the_surface_resolves_and_an_unknown_one_is_named():
    for name in api.__all__:
        assert getattr(api, name) is not None
    with pytest.raises(AttributeError, match="no 'checking'.*passed"):
        api.checking  # noqa: B018
