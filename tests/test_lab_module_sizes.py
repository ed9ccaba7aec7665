"""A lab's checks stay readable: a module per exercise or part, none over 400 lines (and, as everywhere in labkit,
no function over 60: tests/test_house_is_clean.py)."""

from __future__ import annotations

from pathlib import Path

LABS_FOLDER = Path(__file__).resolve().parent.parent / "labkit" / "labs"
MAX_MODULE_LINES = 400


def test_no_module_of_the_labs_is_over_400_lines():
    modules = list(LABS_FOLDER.rglob("*.py"))
    sizes = {
        path.relative_to(LABS_FOLDER).as_posix(): len(path.read_text(encoding="utf-8").splitlines()) for path in modules
    }
    assert any(path.startswith("lab1/") for path in sizes)  # it reads the labs' packages
    long = {path: lines for path, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert not long, f"cut these by exercise or part (at most {MAX_MODULE_LINES} lines each): {long}"
