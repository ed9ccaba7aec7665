"""The grader reads each exercise's cell source from a notebook as data (submissions.exercise_cell_sources)."""

from __future__ import annotations

import nbformat

from labkit.grading.submissions import exercise_cell_sources


def _cell(source, tags, kind="code"):
    cell = nbformat.v4.new_code_cell(source) if kind == "code" else nbformat.v4.new_markdown_cell(source)
    cell.metadata["tags"] = tags
    return cell


def test_exercise_cells_are_read_by_their_tags_in_order():
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        _cell("import torch", []),
        _cell("def f():\n    return 1", ["exercise:lab1.causal_mask"]),
        _cell("check('lab1.causal_mask')", ["check:lab1.causal_mask"]),
        _cell("def helper():\n    return 2", ["exercise:lab1.causal_mask", "other"]),
        _cell("answer in prose", ["exercise:lab1.attention"], kind="markdown"),
        _cell("", ["exercise:"]),
    ]
    sources = exercise_cell_sources(notebook)
    assert sources == {"lab1.causal_mask": "def f():\n    return 1\n\ndef helper():\n    return 2"}


def test_odd_metadata_is_ignored_not_fatal():
    notebook = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("x = 1")
    cell.metadata["tags"] = "exercise:lab1.causal_mask"  # a string, not a list
    notebook.cells = [cell]
    assert exercise_cell_sources(notebook) == {}
