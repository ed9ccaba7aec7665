"""What is in a submitted file: the notebook itself, its code cells, the lab it is for, a report name.

Everything here treats the file as untrusted data: a file that is not a notebook,
or metadata of the wrong shape, gives a `SubmissionError` or is ignored, never a crash.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import nbformat

from labkit.grading.learner_notebook import EXERCISE_TAG

# the run's own reports (reports.py, similarity_page.py)
RUN_FILES = ("checksums.json", "grades.csv", "run.json", "similarity.html", "similarity.json")
# A report may not be named like one of them, nor like its file name in full (no `grades.csv.md` either).
RUN_REPORT_STEMS = frozenset(name for file in RUN_FILES for name in (file, file.partition(".")[0]))
_LAB_ID = re.compile(r"[A-Za-z0-9_]{1,40}")
MAX_NAME_CHARS = 100  # of a report's name, leaving room for its suffix under any file system's limit


class SubmissionError(Exception):
    """The submission cannot be graded at all (not a notebook, unknown lab, ...)."""


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """The notebook at `path`, or a SubmissionError that says what is wrong with the file."""
    if not path.is_file():
        raise SubmissionError(f"{path} is not a file")
    try:
        with warnings.catch_warnings():  # old notebooks without cell ids are fine here
            warnings.simplefilter("ignore")
            return nbformat.read(path, as_version=4)
    except Exception as error:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise SubmissionError(f"{path.name} is not a readable Jupyter notebook ({first_line})") from None


def code_cells(notebook: nbformat.NotebookNode) -> Iterator[tuple[int, str]]:
    """(1-based position among all cells, source) of each code cell with something in it."""
    for position, cell in enumerate(notebook.cells, start=1):
        source = cell.get("source", "")
        if cell.get("cell_type") == "code" and isinstance(source, str) and source.strip():
            yield position, source


def exercise_cell_sources(notebook: nbformat.NotebookNode) -> dict[str, str]:
    """Each exercise's cell source, by exercise id (from its `exercise:<id>` tag), read as data in the
    grader's process: what the similarity report, the source scan and lab 11's kernel rules look at.
    Cells sharing one id are joined in notebook order; a cell without a string source counts as empty."""
    sources: dict[str, list[str]] = {}
    for cell in notebook.cells:
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        tags = _as_dict(cell.get("metadata")).get("tags")
        for tag in tags if isinstance(tags, list) else []:
            if isinstance(tag, str) and tag.startswith(EXERCISE_TAG) and len(tag) > len(EXERCISE_TAG):
                sources.setdefault(tag[len(EXERCISE_TAG) :], []).append(source if isinstance(source, str) else "")
    return {exercise_id: "\n\n".join(parts) for exercise_id, parts in sources.items()}


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def tagged_labs(notebook: nbformat.NotebookNode) -> set[str]:
    """The labs the notebook's exercise cells are tagged for (`exercise:<lab>.<name>`; malformed ids ignored)."""
    labs = set()
    for exercise_id in exercise_cell_sources(notebook):
        lab, dot, name = exercise_id.partition(".")
        if dot and name and _LAB_ID.fullmatch(lab):
            labs.add(lab)
    return labs


def _metadata_lab(notebook: nbformat.NotebookNode) -> object:
    return _as_dict(_as_dict(notebook.get("metadata")).get("labkit")).get("lab")


def infer_lab(notebook: nbformat.NotebookNode) -> str:
    """The lab a notebook is graded against without --lab: the one its exercise tags name. Never its
    metadata alone, which a learner edits as easily as a cell: it only makes a note (`lab_notes`)."""
    labs = tagged_labs(notebook)
    if len(labs) == 1:
        return labs.pop()
    if labs:
        raise SubmissionError(
            f"its exercise cells are tagged for {len(labs)} labs ({', '.join(sorted(labs))}), so which lab it is "
            "for cannot be told; pass --lab"
        )
    raise SubmissionError(
        f"no cell is tagged {EXERCISE_TAG}<lab>.<name>, so which lab it is for cannot be told (its metadata does "
        "not decide); pass --lab"
    )


def lab_notes(notebook: nbformat.NotebookNode, lab: str) -> list[str]:
    """What a submission's report says when its exercise tags or its metadata name another lab than
    `lab`, the one it is graded against."""
    notes = []
    others = sorted(tagged_labs(notebook) - {lab})
    if others:
        notes.append(f"its exercise cells are tagged for {', '.join(others)}; graded against {lab}, as --lab says")
    stated = _metadata_lab(notebook)
    if stated and stated != lab:
        notes.append(
            f"its metadata names the lab {str(stated)[:40]!r}; graded against {lab} (the lab comes from --lab or "
            "the exercise tags, never from metadata)"
        )
    return notes


def _file_stem(stem: str) -> str:
    """`stem` as a safe file name: letters, digits, `.`, `_`, `-` only, no leading dot, not too long."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).lstrip(".") or "submission"
    if len(name) > MAX_NAME_CHARS:  # keep it unique: the cut part's digest stands in for it
        name = f"{name[: MAX_NAME_CHARS - 9]}-{hashlib.sha256(stem.encode()).hexdigest()[:8]}"
    return name


def reserved(stem: str) -> bool:
    """Whether reports named after `stem` would be, or pass for, the run's own files (`RUN_REPORT_STEMS`)."""
    return _file_stem(stem).casefold() in RUN_REPORT_STEMS


def rename_note(path: Path, name: str) -> str | None:
    """What a submission's report says when its file's name is the grader's own (None otherwise): where its
    reports are, so that the learner and the instructor do not take the run's file for them."""
    if not reserved(path.stem):
        return None
    return f"handed in as {path.name!r}; its reports are named {name}: the grader writes {', '.join(RUN_FILES)} itself"


def submission_names(paths: Sequence[Path]) -> list[str]:
    """Unique, safe names for report files, whatever the submissions are called: the file stem, or the
    path below the common folder when stems repeat; a run's own report (`RUN_REPORT_STEMS`) or a
    name already taken (also in another case, for case-insensitive file systems) gets a suffix."""
    stems = [path.stem for path in paths]
    if len(set(stems)) < len(stems):
        common = Path(os.path.commonpath([str(path.resolve().parent) for path in paths]))
        stems = ["__".join(path.resolve().with_suffix("").relative_to(common).parts) for path in paths]
    names: list[str] = []
    taken = set(RUN_REPORT_STEMS)
    for stem in stems:
        name = _file_stem(stem)
        if reserved(name):
            name += "_submission"
        while name.casefold() in taken:  # the same file given twice, or a name that differs only in case
            name += "_again"
        names.append(name)
        taken.add(name.casefold())
    return names
