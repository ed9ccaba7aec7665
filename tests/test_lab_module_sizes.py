"""A lab's checks stay readable: a module per exercise or part, none over 400 lines, no function over 60.

Read by an AST walk (a function runs from its `def` to its last line). The labs not cut by exercise yet are
listed apart; the test fails when one of them is within the limits too, so that the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from labkit.labs.manifest import LABS

LABS_FOLDER = Path(__file__).resolve().parent.parent / "labkit" / "labs"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
NOT_CUT_YET = {"lab7", "lab8", "lab9", "lab10", "lab11", "lab12"}


def too_long(paths: list[Path]) -> list[str]:
    """Every module of ``paths`` over MAX_MODULE_LINES lines and every function in them over MAX_FUNCTION_LINES."""
    found = []
    for path in sorted(paths):
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(LABS_FOLDER.parent.parent)
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found.append(f"{where}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{where}:{node.lineno} {node.name}: {length} lines")
    return found


@pytest.mark.parametrize("lab", [lab.name for lab in LABS])
def test_every_module_and_function_of_a_lab_is_short(lab):
    found = too_long(list((LABS_FOLDER / lab).rglob("*.py")))
    if lab in NOT_CUT_YET:
        assert found, f"{lab} is within the limits now: take it out of NOT_CUT_YET"
    else:
        assert not found, "cut these by exercise, or into named checks:\n" + "\n".join(found)


def test_what_the_labs_share_is_short_too():
    shared = [
        path for path in LABS_FOLDER.rglob("*.py") if not path.relative_to(LABS_FOLDER).parts[0].startswith("lab")
    ]
    assert shared and not too_long(shared), "\n".join(too_long(shared))
