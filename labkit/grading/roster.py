"""Who handed in what: the instructor's roster CSV, checked, and each graded submission matched to one learner.

The roster has a row per learner: `file` (the notebook as handed in: its name, or as much of its
path as tells it apart), `student`, `id` and `section`, and optionally `sis_user_id`. Every way the
mapping could grade the wrong person stops with an error that names the rows: a learner (`id`)
given twice, a file given twice or matching two submissions, a graded submission no row names.
A learner whose file was not graded has no submission: `match_roster` lists them, and the caller
decides (an error, or 0 points listed as such).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

REQUIRED_COLUMNS = ("file", "student", "id", "section")


class RosterError(ValueError):
    """A roster that cannot map submissions to learners without guessing (the message names the rows)."""


@dataclass(frozen=True)
class Learner:
    """One roster row (`row` counts as a spreadsheet does: the header is row 1)."""

    row: int
    file: str
    student: str
    id: str
    section: str
    sis_user_id: str = ""


def read_roster(path: Path) -> list[Learner]:
    """The roster's learners, or a RosterError for a missing column, an empty cell, an id or a file given twice."""
    with Path(path).open(newline="", encoding="utf-8-sig") as file:  # -sig: a spreadsheet's byte-order mark
        reader = csv.DictReader(file)
        columns = [name.strip().lower() for name in reader.fieldnames or []]
        missing = [name for name in REQUIRED_COLUMNS if name not in columns]
        if missing:
            raise RosterError(f"{path}: no column {', '.join(missing)}; the roster needs {', '.join(REQUIRED_COLUMNS)}")
        rows = [{key.strip().lower(): (value or "").strip() for key, value in row.items() if key} for row in reader]
    learners, by_id, by_file = [], {}, {}
    for number, row in enumerate(rows, start=2):
        learner = Learner(number, row["file"], row["student"], row["id"], row["section"], row.get("sis_user_id", ""))
        empty = [name for name in ("file", "student", "id") if not getattr(learner, name)]
        if empty:
            raise RosterError(f"{path} row {number}: {', '.join(empty)} is empty")
        if learner.id in by_id:
            raise RosterError(
                f"{path}: learner {learner.id} ({learner.student}) is named twice, in rows {by_id[learner.id]} and "
                f"{number}; give each learner one row"
            )
        if learner.file in by_file:
            raise RosterError(
                f"{path}: the file {learner.file} is given in rows {by_file[learner.file]} and {number}; "
                "each submission belongs to one learner"
            )
        by_id[learner.id], by_file[learner.file] = number, number
        learners.append(learner)
    return learners


def _names(file: str, path: str) -> bool:
    """Whether the roster's `file` names the submission at `path`: equal to its last path components."""
    wanted = PurePosixPath(file.replace("\\", "/")).parts
    return PurePosixPath(path.replace("\\", "/")).parts[-len(wanted) :] == wanted


@dataclass(frozen=True)
class Matching:
    """Each learner with a submission -> that submission's report name; and the learners without one."""

    submitted: dict[str, str]  # learner id -> report name
    absent: list[Learner]


def match_roster(learners: Sequence[Learner], submissions: dict[str, str]) -> Matching:
    """Match `submissions` (report name -> the path it was graded from) to the roster's learners.

    A file that matches two submissions, a submission two files match and a submission no file
    matches are RosterErrors; a learner whose file matches none is listed in `absent`."""
    owner: dict[str, Learner] = {}
    submitted, absent = {}, []
    for learner in learners:
        found = [name for name, path in submissions.items() if _names(learner.file, path)]
        if len(found) > 1:
            raise RosterError(
                f"roster row {learner.row}: the file {learner.file} matches {len(found)} submissions "
                f"({', '.join(submissions[name] for name in found)}); give more of its path, e.g. alice/lab2.ipynb"
            )
        if not found:
            absent.append(learner)
            continue
        (name,) = found
        if name in owner:
            raise RosterError(
                f"the submission {submissions[name]} is named by roster rows {owner[name].row} "
                f"({owner[name].file}) and {learner.row} ({learner.file}); each submission belongs to one learner"
            )
        owner[name], submitted[learner.id] = learner, name
    unclaimed = [path for name, path in submissions.items() if name not in owner]
    if unclaimed:
        shown = ", ".join(unclaimed[:10]) + (f" and {len(unclaimed) - 10} more" if len(unclaimed) > 10 else "")
        raise RosterError(
            f"{len(unclaimed)} graded submission(s) are in no roster row: {shown}; add their learners to the roster "
            "(or remove the files from the run)"
        )
    return Matching(submitted, absent)
