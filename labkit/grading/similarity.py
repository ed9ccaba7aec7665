"""Copying is found, not blocked: each exercise cell compared with labkit's answer and with every classmate's.

The engine is copydetect (PyPI), which fingerprints code as MOSS does: pygments tokens with every
name, string and comment abstracted away (so renaming variables changes nothing), k-grams of them
hashed, and winnowing. The starter cell every learner was handed is its boilerplate: a match inside
it counts for nothing. A pair's score is the larger of its two shares, each the part of one cell's
fingerprinted code that the other cell holds too (1.0: all of it), so a cell pasted into a longer one
still scores high. A pair at or above its exercise's threshold is listed for review with the matched
code of both sides (`similarity_page.py`), beside the findings of the source scan (`source_scan.py`);
a submission's flags go to the `flags` column of grades.csv. Nothing here changes a grade: a flag is a
reason to read two cells, not a verdict.

An exercise whose answer is too short to fingerprint meaningfully (a one-line mask: every honest
answer looks like every other) is "too short to compare", and so is any cell with less code of its
own than that: such cells are listed, never flagged. A cell left as handed out is skipped.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from labkit.grading.checks import exercises_for_lab
from labkit.grading.report_text import escaped
from labkit.grading.source_scan import Finding, scan_notebook
from labkit.grading.submissions import SubmissionError, code_cells, exercise_cell_sources, read_notebook

if TYPE_CHECKING:
    from labkit.grading.grader import SubmissionGrade
    from labkit.grading.reference_sources import LabReferences

# copydetect's noise threshold (k): the shortest run of tokenised code, in characters, that counts as
# a match. Names become one letter there (`scores = q @ k` is `V=V@V`), so 25 characters is about one
# line. The guarantee threshold is the same (a winnowing window of 1 keeps every k-gram): cells are
# short, and a class is small enough to afford it.
NOISE_CHARACTERS = 25
# Less code of its own than this (tokenised characters on lines the starter cell does not have) is too
# short to compare: about two lines, where honest answers to one question coincide. It leaves out lab 1's
# causal_mask, lab 2's kv_bytes_per_token and conversations_that_fit, lab 3's padded_causal_mask, lab 4's
# preemption, lab 5's slot_mapping, lab 6's prefill_chunks, lab 8's rollback, lab 9's find_capacity and
# lab 10's quality (their solved answers have 13 to 48); every other answer has 52 or more.
MIN_CHARACTERS = 50
# How the thresholds were set: tests/fixtures/similarity/ holds independent honest answers to every
# exercise of labs 1 and 7 (three or four styles each: loops, vectorised, library calls), written apart.
# `python scripts/similarity_calibration.py` prints, per exercise, the highest score an honest answer gets
# against labkit's answers and against another honest answer: at most 0.50 and 0.59 (lab 1's
# generate_without_cache, two loops over prefill). The default sits well above them; a pasted reference
# scores 1.0, with its names changed too. An exercise that needs another threshold is listed here.
DEFAULT_THRESHOLD = 0.8
THRESHOLDS: dict[str, float] = {}

REFERENCE = "reference"
CLASSMATE = "classmate"
SOLVED_LABEL = "solved notebook"  # how reference_sources labels the solved notebook's cell


def threshold(exercise: str) -> float:
    """The score at or above which a pair of cells of this exercise is flagged."""
    return THRESHOLDS.get(exercise, DEFAULT_THRESHOLD)


@dataclass(frozen=True)
class Pair:
    """Two cells of one exercise whose score reached its threshold, with the matched spans of each
    (character offsets into its source, for the side-by-side view)."""

    exercise: str
    kind: str  # REFERENCE (`other` labels labkit's answer) or CLASSMATE (`other` is a submission)
    submission: str
    other: str
    score: float
    shares: tuple[float, float]  # of the submission's cell, of the other's
    sources: tuple[str, str]
    spans: tuple[list[tuple[int, int]], list[tuple[int, int]]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ClassSimilarity:
    """What the similarity report holds: flagged pairs, cells too short to compare, the source scan's
    findings, and each submission's exercise cells (so that `labkit grade merge` can compare shards);
    or, where it could not be made, why (`problem`)."""

    cells: dict[str, dict[str, Any]]  # submission -> {"lab": lab, "cells": `submitted_cells`}
    pairs: list[Pair] = field(default_factory=list)
    too_short: dict[str, list[str]] = field(default_factory=dict)  # exercise -> submissions (or REFERENCE)
    findings: dict[str, list[Finding]] = field(default_factory=dict)  # submission -> its scan's findings
    thresholds: dict[str, float] = field(default_factory=dict)  # exercise -> the threshold it was judged by
    notes: list[str] = field(default_factory=list)
    problem: str | None = None

    def flags(self) -> dict[str, str]:
        """Each submission's flags, for the `flags` column of grades.csv ("" where nothing was flagged)."""
        flagged: dict[str, list[str]] = {name: [] for name in self.cells}
        for pair in self.pairs:
            if pair.kind == REFERENCE:
                flagged[pair.submission].append(f"{pair.exercise}: copied reference {pair.score:.2f} ({pair.other})")
            else:
                flagged[pair.submission].append(f"{pair.exercise}: same as {pair.other} {pair.score:.2f}")
                flagged[pair.other].append(f"{pair.exercise}: same as {pair.submission} {pair.score:.2f}")
        for name, findings in self.findings.items():
            flagged[name] += [f"{found.exercise}: line {found.line} uses {found.what}" for found in findings]
        return {name: "; ".join(lines) for name, lines in flagged.items()}

    def summary(self) -> str:
        """One line for the end of a run."""
        if self.problem:
            return f"the similarity report could not be made: {escaped(self.problem)}"
        scanned = len(self.findings)
        return (
            f"similarity report: {len(self.pairs)} pair(s) of cells flagged, {scanned} submission(s) with code "
            "that reaches around a check (similarity.html; grades unchanged)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": _engine(),
            "problem": self.problem,
            "noise_characters": NOISE_CHARACTERS,
            "min_characters": MIN_CHARACTERS,
            "thresholds": self.thresholds,
            "pairs": [pair.to_dict() for pair in self.pairs],
            "too_short": self.too_short,
            "findings": {name: [found.to_dict() for found in found_list] for name, found_list in self.findings.items()},
            "flags": self.flags(),
            "notes": self.notes,
            "cells": self.cells,
        }


def _engine() -> str:
    try:
        return f"copydetect {metadata.version('copydetect')}"
    except metadata.PackageNotFoundError:
        return "copydetect (not installed: pip install 'labkit[labs]')"


def _fingerprint(source: str, boilerplate: np.ndarray | None = None) -> Any:
    from copydetect import CodeFingerprint

    return CodeFingerprint("cell.py", NOISE_CHARACTERS, 1, boilerplate, language="python", fp=io.StringIO(source))


class _Exercise:
    """copydetect's view of one exercise: its starter cell as boilerplate, and how much code a cell has of its own."""

    def __init__(self, starter: str) -> None:
        self.starter_lines = {line.strip() for line in starter.splitlines()}
        self.starter = _fingerprint(starter) if starter else None
        self.boilerplate = np.array(sorted(self.starter.hashes)) if self.starter else np.array([])

    def fingerprint(self, source: str) -> Any:
        return _fingerprint(source, self.boilerplate)

    def unchanged(self, fingerprint: Any) -> bool:
        """The cell as handed out (comments and layout aside)."""
        return self.starter is not None and fingerprint.filtered_code == self.starter.filtered_code

    def own_code(self, source: str) -> int:
        """Tokenised characters on the cell's lines that the starter cell does not have."""
        from copydetect.utils import filter_code

        own = "\n".join(line for line in source.splitlines() if line.strip() not in self.starter_lines)
        return len(filter_code(own, "cell.py", "python")[0])

    def answer_size(self, references: Mapping[str, str]) -> int | None:
        """The size of the exercise's answer as posed: its solved notebook cell's own code (None without one:
        labkit's answers are often more general than the exercise, so their size says little)."""
        sizes = [self.own_code(source) for label, source in references.items() if label.startswith(SOLVED_LABEL)]
        return max(sizes) if sizes else None


def _spans(slices: np.ndarray) -> list[tuple[int, int]]:
    """copydetect's matched slices (a row of starts, a row of ends) as (start, end) character offsets."""
    return [(int(start), int(end)) for start, end in zip(slices[0], slices[1])] if slices.size else []


def _pair(exercise: str, kind: str, names: tuple[str, str], sources: tuple[str, str], prints: tuple[Any, Any]) -> Pair:
    from copydetect import compare_files

    _, (share_first, share_second), (slices_first, slices_second) = compare_files(*prints)
    shares = (float(share_first), float(share_second))
    return Pair(exercise, kind, *names, max(shares), shares, sources, (_spans(slices_first), _spans(slices_second)))


def _compare_exercise(
    exercise: str, cells: Mapping[str, str], references: Mapping[str, str], starter: str, report: ClassSimilarity
) -> None:
    """Add the exercise's flagged pairs and cells too short to compare to `report`."""
    view = _Exercise(starter)
    limit = report.thresholds[exercise] = threshold(exercise)
    prints = {name: view.fingerprint(source) for name, source in cells.items()}
    attempted = [name for name in cells if not view.unchanged(prints[name])]
    size = view.answer_size(references)
    if size is not None and size < MIN_CHARACTERS:  # the answer itself is too short: nothing is compared
        report.too_short[exercise] = [REFERENCE, *attempted]
        return
    short = [name for name in attempted if view.own_code(cells[name]) < MIN_CHARACTERS]
    if short:
        report.too_short[exercise] = short
    compared = [name for name in attempted if name not in short]
    refs = {label: view.fingerprint(source) for label, source in references.items()}
    candidates = []
    for position, name in enumerate(compared):
        for label, source in references.items():
            candidates.append(
                _pair(exercise, REFERENCE, (name, label), (cells[name], source), (prints[name], refs[label]))
            )
        for other in compared[position + 1 :]:
            candidates.append(
                _pair(exercise, CLASSMATE, (name, other), (cells[name], cells[other]), (prints[name], prints[other]))
            )
    report.pairs += [pair for pair in candidates if pair.score >= limit]


def compare_class(
    cells: Mapping[str, tuple[str, Mapping[str, str]]], references: Callable[[str], LabReferences] | None = None
) -> ClassSimilarity:
    """The similarity report of a class: `cells` maps each submission to (its lab, its `submitted_cells`);
    `references(lab)` gives the lab's `LabReferences` (default: `lab_references`). Only the lab's own
    exercises are compared: a tag the lab does not have is the learner's text, not an exercise."""
    from labkit.grading.reference_sources import lab_references

    cells = dict(sorted(cells.items()))  # by name: a merge of shards reports exactly what one run would
    report = ClassSimilarity({name: {"lab": lab, "cells": dict(sources)} for name, (lab, sources) in cells.items()})
    for lab in sorted({lab for lab, _ in cells.values()}):
        lab_refs = (references or lab_references)(lab)
        report.notes += lab_refs.notes
        answers = {exercise.id: exercise.answers for exercise in exercises_for_lab(lab)}
        for exercise in answers:
            of_lab = {
                name: cell[exercise] for name, (its_lab, cell) in cells.items() if its_lab == lab and exercise in cell
            }
            references_of = lab_refs.references.get(exercise, {})
            _compare_exercise(exercise, of_lab, references_of, lab_refs.starters.get(exercise, ""), report)
        for name, (its_lab, sources) in cells.items():
            if its_lab == lab and (found := scan_notebook(sources, answers, lab_refs.handed_out)):
                report.findings[name] = found
    report.pairs.sort(key=lambda pair: (pair.exercise, -pair.score, pair.submission, pair.other))
    return report


def _guarded(make: Callable[[], ClassSimilarity]) -> ClassSimilarity:
    """`make()`, or a report that says why it failed: the similarity report never fails a run."""
    try:
        return make()
    except Exception as error:
        return ClassSimilarity({}, problem=f"{type(error).__name__}: {error}")


def submitted_cells(notebook: Any) -> dict[str, str]:
    """A notebook's code as the report takes it: each exercise's cell by its id, and each other code cell
    as `cell N` (its position), which only the source scan reads."""
    exercises = exercise_cell_sources(notebook)
    others = {
        f"cell {position}": source
        for position, source in code_cells(notebook)
        if not any(source in joined for joined in exercises.values())  # an exercise's cells are joined there
    }
    return {**exercises, **others}


def class_similarity(grades: Sequence[SubmissionGrade]) -> ClassSimilarity:
    """The report of a graded class, from each graded notebook's exercise cells (a file that is no longer a
    readable notebook is left out; its grade says why). Never raises."""

    def make() -> ClassSimilarity:
        cells = {}
        for grade in grades:
            if grade.error is None and grade.lab is not None:
                try:
                    cells[grade.name] = (grade.lab, submitted_cells(read_notebook(Path(grade.path))))
                except SubmissionError:
                    continue
        return compare_class(cells)

    return _guarded(make)


def merged_similarity(folders: Sequence[Path]) -> ClassSimilarity | None:
    """The report over every shard's submissions, from the cells each shard's similarity.json kept; None
    where a shard made none (graded with --no-similarity). Never raises. The folders are verified shards."""
    reports = [folder / "similarity.json" for folder in folders]
    if not all(path.is_file() for path in reports):
        return None

    def make() -> ClassSimilarity:
        cells = {}
        for path in reports:
            data = json.loads(path.read_text())
            if data["problem"]:
                raise ValueError(f"{path} holds no cells: {data['problem']}")
            cells.update({name: (entry["lab"], entry["cells"]) for name, entry in data["cells"].items()})
        return compare_class(cells)

    return _guarded(make)
