"""What a submission's exercise cells are compared with: labkit's own answer to each exercise, and the
starter code every learner was handed (which is no one's work, so matches inside it do not count).

Per exercise: the solved notebook's exercise cell (`labs/source/STEM.ipynb`, found through the labs'
manifest), the source of each labkit callable the exercise declares as its `answers` (`inspect.getsource`),
and the starter cell, which is the learner notebook's cell as `make-labs` generates it from that solved
notebook (hint comments and `raise NotImplementedError`). A lab without a solved notebook here (the demo
lab, or labkit installed without its `labs/` folder) is compared with its answers' source only, and says so.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path

import labkit
from labkit.grading.answers import reference
from labkit.grading.checks import exercises_for_lab
from labkit.grading.learner_notebook import make_learner_notebook
from labkit.grading.similarity import SOLVED_LABEL
from labkit.grading.submissions import SubmissionError, code_cells, exercise_cell_sources, read_notebook
from labkit.labs import manifest

LAB_SOURCES = Path(labkit.__file__).resolve().parents[1] / "labs" / "source"  # beside the labkit package


@dataclass
class LabReferences:
    """One lab's references: exercise id -> {label: source}, the starter cells, and what could not be found."""

    references: dict[str, dict[str, str]] = field(default_factory=dict)
    starters: dict[str, str] = field(default_factory=dict)
    handed_out: frozenset[str] | None = None  # the stripped lines of the learner notebook's code cells
    notes: list[str] = field(default_factory=list)


def solved_notebook(lab: str, folder: Path = LAB_SOURCES) -> Path | None:
    """The lab's solved notebook in `folder`, or None (a lab the manifest does not list, or no such file)."""
    try:
        path = folder / manifest.lab(lab).notebook
    except KeyError:
        return None
    return path if path.is_file() else None


def _answer_source(dotted: str) -> str | None:
    try:
        return inspect.getsource(reference(dotted))
    except (ImportError, AttributeError, OSError, TypeError):  # a builtin, or a module without its source file
        return None


def lab_references(lab: str, folder: Path = LAB_SOURCES) -> LabReferences:
    """Everything `lab`'s exercise cells are compared with (the lab's exercises must be importable)."""
    found = LabReferences()
    exercises = exercises_for_lab(lab)
    path = solved_notebook(lab, folder)
    if path is None:
        found.notes.append(f"{lab}: no solved notebook in {folder}; its cells are compared with labkit's answers only")
    else:
        try:
            solved = read_notebook(path)
        except SubmissionError as error:
            found.notes.append(f"{lab}: {error}; its cells are compared with labkit's answers only")
        else:
            learner = make_learner_notebook(solved, lab, path.name)
            found.starters = exercise_cell_sources(learner)
            found.handed_out = frozenset(
                line.strip() for _, source in code_cells(learner) for line in source.split("\n")
            )
            for exercise_id, source in exercise_cell_sources(solved).items():
                found.references.setdefault(exercise_id, {})[f"{SOLVED_LABEL} {path.name}"] = source
    for exercise in exercises:
        for dotted in exercise.answers:
            answer = _answer_source(dotted)
            if answer is None:
                found.notes.append(f"{exercise.id}: the source of {dotted} could not be read; not compared with it")
            else:
                found.references.setdefault(exercise.id, {})[dotted] = answer
    return found
