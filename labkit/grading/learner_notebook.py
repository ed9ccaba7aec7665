"""Make a learner's notebook from a solved lab notebook: solutions out, blanks in.

Solution regions are marked as in nbgrader, on lines of their own:

    ### BEGIN SOLUTION
    # HINT: a line like this is kept for the learner
    ...the solution...
    ### END SOLUTION

In a code cell (which must carry the tag `exercise:<id>`) the region becomes its
hint lines (or "# Your code here.") and `raise NotImplementedError("Exercise <id>: ...")`;
in a Markdown cell it becomes "_Your answer here._". Outputs and execution counts
are dropped, cell ids and tags kept, and check cells (tag `check:<id>`) are locked.
The result depends only on the source, so a stale learner notebook can be detected.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import nbformat

from labkit.grading.checks import lab_of

EXERCISE_TAG = "exercise:"
CHECK_TAG = "check:"
_BEGIN = re.compile(r"^\s*#+\s*BEGIN SOLUTION\s*$")
_END = re.compile(r"^\s*#+\s*END SOLUTION\s*$")
_HINT = re.compile(r"^\s*#\s*HINT:")
_KEPT_METADATA = ("tags", "editable", "deletable")
_LAB_NAME = re.compile(r"^([A-Za-z][A-Za-z0-9]*)_")


class SourceError(ValueError):
    """A lab source notebook is malformed (unbalanced markers, missing exercise tag, ...)."""


def _replace_regions(source: str, blank: Callable[[str, list[str]], list[str]], where: str) -> tuple[str, bool]:
    """The source with each solution region replaced by blank(indent, hint_lines); and whether there was one."""
    kept: list[str] = []
    region: list[str] | None = None
    indent = ""
    found = False
    for number, line in enumerate(source.splitlines(), start=1):
        if _BEGIN.match(line):
            if region is not None:
                raise SourceError(f"{where}, line {number}: BEGIN SOLUTION inside another solution region")
            region, indent, found = [], line[: len(line) - len(line.lstrip())], True
        elif _END.match(line):
            if region is None:
                raise SourceError(f"{where}, line {number}: END SOLUTION without a BEGIN SOLUTION above it")
            kept += blank(indent, [hint.strip() for hint in region if _HINT.match(hint)])
            region = None
        elif region is not None:
            region.append(line)
        else:
            kept.append(line)
    if region is not None:
        raise SourceError(f"{where}: BEGIN SOLUTION without a matching END SOLUTION")
    ending = "\n" if source.endswith("\n") else ""
    return "\n".join(kept) + ending, found


def _code_blank(exercise_id: str) -> Callable[[str, list[str]], list[str]]:
    def blank(indent: str, hints: list[str]) -> list[str]:
        comments = hints or ["# Your code here."]
        message = f"Exercise {exercise_id}: replace this line with your code"
        return [indent + comment for comment in comments] + [
            f"{indent}raise NotImplementedError({json.dumps(message, ensure_ascii=False)})"
        ]

    return blank


def _markdown_blank(indent: str, hints: list[str]) -> list[str]:
    return [indent + "_Your answer here._"]


def _tagged_ids(tags: list[str], prefix: str) -> list[str]:
    return [tag[len(prefix) :] for tag in tags if tag.startswith(prefix)]


def make_learner_notebook(source: nbformat.NotebookNode, lab: str, source_name: str) -> nbformat.NotebookNode:
    """The learner's version of a solved lab notebook (see the module docstring for the rules)."""
    learner = nbformat.v4.new_notebook()
    learner.metadata = {key: source.metadata[key] for key in ("kernelspec", "language_info") if key in source.metadata}
    learner.metadata["labkit"] = {"lab": lab, "generated_from": source_name}
    for index, cell in enumerate(source.cells):
        where = f"{source_name}, cell {index + 1}"
        metadata = {key: cell.metadata[key] for key in _KEPT_METADATA if key in cell.metadata}
        tags = list(metadata.get("tags", []))
        exercise_ids = _tagged_ids(tags, EXERCISE_TAG)
        for exercise_id in exercise_ids + _tagged_ids(tags, CHECK_TAG):
            if lab_of(exercise_id) != lab:
                raise SourceError(
                    f"{where}: tag id {exercise_id!r} should start with '{lab}.' (the lab's file name says {lab})"
                )
        if _tagged_ids(tags, CHECK_TAG):
            metadata.update(editable=False, deletable=False)
        options = {"metadata": metadata, "id": cell.get("id") or f"{lab}-cell-{index + 1}"}
        if cell.cell_type == "code":
            blank = _code_blank(exercise_ids[0] if len(exercise_ids) == 1 else "")
            text, found = _replace_regions(cell.source, blank, where)
            if found and len(exercise_ids) != 1:
                raise SourceError(
                    f"{where}: a code cell with a solution needs exactly one tag 'exercise:<id>' "
                    f"(it has {len(exercise_ids)})"
                )
            learner.cells.append(nbformat.v4.new_code_cell(text, **options))
        elif cell.cell_type == "markdown":
            text, _ = _replace_regions(cell.source, _markdown_blank, where)
            if "attachments" in cell:
                options["attachments"] = cell.attachments
            learner.cells.append(nbformat.v4.new_markdown_cell(text, **options))
        else:
            learner.cells.append(nbformat.v4.new_raw_cell(cell.source, **options))
    return learner


def render_learner_notebook(source: nbformat.NotebookNode, lab: str, source_name: str) -> str:
    """The learner notebook as the exact text written to disk (what the staleness check compares)."""
    return nbformat.writes(make_learner_notebook(source, lab, source_name)) + "\n"


def lab_name(path: Path) -> str:
    """The lab id a source file's name gives: lab2 for lab2_kv_cache.ipynb."""
    match = _LAB_NAME.match(path.name)
    if not match:
        raise SourceError(f"{path}: name lab sources '<lab>_<topic>.ipynb', e.g. lab2_kv_cache.ipynb")
    return match.group(1)


def learner_text(source_path: Path, out_dir: Path) -> str:
    """The text of the learner notebook that the source at `source_path` generates into `out_dir`."""
    source = nbformat.read(source_path, as_version=4)
    source_name = Path(os.path.relpath(source_path, out_dir)).as_posix()
    return render_learner_notebook(source, lab_name(source_path), source_name)
