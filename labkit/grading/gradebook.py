"""What an LMS takes from a finished run: a gradebook CSV in Canvas's import shape and a feedback file per learner.

`write_gradebook` reads a run's reports (a single run's folder, or `labkit grade merge`'s) only
after checking every one against its checksums.json, maps each submission to a learner through the
instructor's roster (`roster.py`), and writes, in the roster's order, `gradebook.csv` (Canvas's
columns Student, ID, SIS User ID, Section, then one column for the assignment, holding the total)
and `feedback/ID.md` per learner: each exercise's status, points, first difference found and the
hint tier reached. A learner with no graded submission is an error unless the instructor asks for
a 0 (`missing_zero`); then the 0 is listed in `Gradebook.absent` and said in the learner's feedback.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.grading.report_text import code_block, csv_cell, escaped
from labkit.grading.result import PASS, STATUS_LABELS
from labkit.grading.roster import Learner, RosterError, match_roster, read_roster
from labkit.grading.shards import read_shard

CANVAS_COLUMNS = ("Student", "ID", "SIS User ID", "Section")
GRADEBOOK_FILE = "gradebook.csv"
FEEDBACK_FOLDER = "feedback"
_DIFFERENCE_LABELS = ("First difference", "Problem")


class GradebookError(ValueError):
    """Reports that cannot honestly become a gradebook (the message names the file or the learner and the fix)."""


@dataclass
class Gradebook:
    """What `write_gradebook` wrote, and the learners given 0 for want of a submission."""

    csv_path: Path
    feedback: dict[str, Path] = field(default_factory=dict)  # learner id -> feedback file
    absent: list[Learner] = field(default_factory=list)


def _points(value: float) -> str:
    return f"{value:g}"


def read_run_reports(folder: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A whole run's run.json and its reports (name -> NAME.json), each checked against checksums.json."""
    run = read_shard(folder).run
    if run["shard"] != "1/1":
        raise GradebookError(
            f"{folder} holds shard {run['shard']} only: merge the shards first (labkit grade merge ... --out DIR) "
            "and make the gradebook from DIR"
        )
    return run, {name: json.loads((folder / f"{name}.json").read_text()) for name in run["graded"]}


def _lab_of(run: dict[str, Any], reports: dict[str, dict[str, Any]]) -> str:
    labs = {run["settings"].get("lab")} - {None} or {report["lab"] for report in reports.values()} - {None}
    if len(labs) != 1:
        raise GradebookError(
            f"the reports are of {len(labs)} labs ({', '.join(sorted(labs)) or 'none'}); a gradebook column is one "
            "assignment: grade the class with --lab, or pass --assignment"
        )
    return labs.pop()


def _first_difference(message: str) -> str:
    """The line of a verdict's message that says what was wrong, or its headline."""
    lines = message.splitlines()
    return next((line for line in lines if line.partition(": ")[0] in _DIFFERENCE_LABELS), lines[0] if lines else "")


def _hint_line(message: str) -> str | None:
    return next((line for line in message.splitlines() if line.startswith("Hint: ")), None)


def learner_feedback(learner: Learner, assignment: str, report: dict[str, Any] | None) -> str:
    """One learner's feedback in Markdown: the score, then per exercise its status, points, first
    difference and hint tier (from the report; `None`: nothing of theirs was graded)."""
    title = f"# {escaped(assignment)}: {escaped(learner.student)} ({escaped(learner.id)})"
    if report is None:
        return "\n".join([title, "", "No submission of yours was graded: **0 points**.", ""])
    lines = [title, "", f"**{_points(report['score'])} / {_points(report['max_score'])} points**", ""]
    if report.get("error"):
        lines += ["Your notebook could not be graded:", "", *code_block(report["error"]), ""]
    with_hints = any("hints_shown" in entry for entry in report["exercises"])
    lines += ["| Exercise | Result | Points |" + (" Hint tier reached |" if with_hints else "")]
    lines += ["|---|---|---|" + ("---|" if with_hints else "")]
    for entry in report["exercises"]:
        label = STATUS_LABELS.get(entry["status"], entry["status"].upper())
        row = f"| `{entry['id']}` | {label} | {_points(entry['points'])} / {_points(entry['max_points'])} |"
        lines.append(row + (f" {entry.get('hints_shown', 0)} |" if with_hints else ""))
    for entry in report["exercises"]:
        if entry["status"] == PASS:
            continue
        shown = [_first_difference(entry["message"]), _hint_line(entry["message"])]
        lines += ["", f"## `{entry['id']}`", "", *code_block("\n\n".join(filter(None, shown)))]
    return "\n".join(lines) + "\n"


def _file_name(learner_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", learner_id).lstrip(".") or "learner"


def write_gradebook(
    report_dir: Path, roster_path: Path, out_dir: Path, assignment: str | None = None, missing_zero: bool = False
) -> Gradebook:
    """Write OUT/gradebook.csv and OUT/feedback/ID.md from a run's verified reports and the roster."""
    run, reports = read_run_reports(report_dir)
    learners = read_roster(roster_path)
    matching = match_roster(learners, {name: report["path"] for name, report in reports.items()})
    if matching.absent and not missing_zero:
        shown = "; ".join(f"row {learner.row}: {learner.student} ({learner.file})" for learner in matching.absent)
        raise RosterError(
            f"{len(matching.absent)} learner(s) of the roster have no graded submission: {shown}. Grade their "
            "files, fix the roster, or pass --missing-zero to give them 0 (they are then listed)"
        )
    files = {}
    for learner in learners:
        name = _file_name(learner.id)
        if name.casefold() in files:
            raise RosterError(
                f"the ids {files[name.casefold()]} and {learner.id} give the same feedback file {name}.md"
            )
        files[name.casefold()] = learner.id
    assignment = assignment or _lab_of(run, reports)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / FEEDBACK_FOLDER).mkdir(exist_ok=True)
    book = Gradebook(out_dir / GRADEBOOK_FILE, absent=matching.absent)
    with book.csv_path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow([*CANVAS_COLUMNS, assignment])
        for learner in learners:
            report = reports.get(matching.submitted.get(learner.id, ""))
            score = _points(report["score"]) if report else "0"
            writer.writerow(map(csv_cell, [learner.student, learner.id, learner.sis_user_id, learner.section, score]))
            path = out_dir / FEEDBACK_FOLDER / f"{_file_name(learner.id)}.md"
            path.write_text(learner_feedback(learner, assignment, report), encoding="utf-8")
            book.feedback[learner.id] = path
    return book
