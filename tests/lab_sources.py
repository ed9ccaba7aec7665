"""The lab sources' solved cells, as a learner who finished them has them: one place for every test that needs them.

The answers are the solution cells of ``labs/source`` themselves, so a test cannot drift from the
notebooks; a wrong answer is a solution with one typical mistake edited in.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

SOURCES = Path(__file__).resolve().parents[1] / "labs" / "source"


def source_cells(lab: str) -> list:
    """The code cells of the solved notebook of ``lab`` (like "lab4")."""
    (path,) = SOURCES.glob(f"{lab}_*.ipynb")
    return [cell for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]


def is_exercise(cell) -> bool:
    return any(tag.startswith("exercise:") for tag in cell.metadata.get("tags", []))


def solved_namespace(lab: str) -> dict:
    """What a learner who solved every exercise has: the notebook's first code cell, then its exercise cells."""
    cells = source_cells(lab)
    namespace: dict = {}
    exec(cells[0].source, namespace)
    for cell in cells:
        if is_exercise(cell):
            exec(cell.source, namespace)
    return namespace


def solved(lab: str, name: str, edits: tuple[tuple[str, str], ...] = ()):
    """The solved function (or class) ``name`` of ``lab``, with each (old, new) edit applied to its cell first."""
    cells = source_cells(lab)
    code = next(
        cell.source
        for cell in cells
        if is_exercise(cell) and (f"def {name}(" in cell.source or f"class {name}" in cell.source)
    )
    for old, new in edits:
        assert old in code, f"the edit target {old!r} is not in the solution of {lab}'s {name}"
        code = code.replace(old, new)
    namespace: dict = {}
    exec(cells[0].source, namespace)
    exec(code, namespace)
    return namespace[name]


def exercise_cell(exercise_id: str) -> str:
    """The solved cell tagged ``exercise:<exercise_id>`` (like "lab7.lru_free")."""
    cells = source_cells(exercise_id.split(".")[0])
    return next(cell.source for cell in cells if f"exercise:{exercise_id}" in cell.metadata.get("tags", []))


def solved_exercise(exercise_id: str, names: tuple[str, ...], edits: tuple[tuple[str, str], ...] = ()) -> tuple:
    """The functions ``names`` of an exercise's solved cell, with each (old, new) edit applied to it first."""
    code = exercise_cell(exercise_id)
    for old, new in edits:
        assert old in code, f"the edit target {old!r} is not in the solution of {exercise_id}"
        code = code.replace(old, new)
    namespace: dict = {}
    exec(source_cells(exercise_id.split(".")[0])[0].source, namespace)
    exec(code, namespace)
    return tuple(namespace[name] for name in names)
