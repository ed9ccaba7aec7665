"""The autograder: run each submission in a fresh kernel, then judge it in this process.

For one submission: read the notebook (a broken file becomes an error entry), run
its code cells in a `KernelSession` (timeouts, crash recovery), then for each
exercise of the lab ask the kernel to run the learner's functions on inputs from a
seed drawn here after the notebook finished, saved to a fresh file path chosen
here. The outputs are loaded back with torch.load(weights_only=True) and compared
with the oracle computed here. Nothing the notebook printed or wrote is read, so
faking a PASS, a results file or labkit's checks earns nothing.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import torch
from tqdm.auto import tqdm

import labkit
from labkit.grading import kernel_session as ks
from labkit.grading.attempt import OK, Attempt
from labkit.grading.checks import Exercise, exercises_for_lab
from labkit.grading.judge import expected_outputs, judge, verdict
from labkit.grading.kernel_side import attempt_code
from labkit.grading.result import CRASHED, ERROR, MISSING, NOT_DONE, NOT_RUN, TIMEOUT, CheckResult
from labkit.grading.submissions import SubmissionError, code_cells, infer_lab, read_notebook, submission_names

_RECORD_STATUSES = {OK, NOT_DONE, ERROR, MISSING}
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY|PRIVATE_?KEY", re.IGNORECASE)
# What went wrong in the kernel while the grader ran an exercise -> the verdict's status.
_GRADER_CODE_PROBLEMS = {ks.TIMED_OUT: TIMEOUT, ks.DIED: CRASHED, ks.SKIPPED: NOT_RUN, ks.RAISED: ERROR}


@dataclass(frozen=True)
class GradeSettings:
    """Limits and choices for one grading run."""

    cell_timeout: float = 60.0  # seconds per notebook cell, and per exercise when the grader calls it
    total_timeout: float = 600.0  # seconds for all of the notebook's own cells together
    lab: str | None = None  # None: read it from the notebook (metadata, or its exercise tags)
    kernel_name: str = "python3"


@dataclass
class SubmissionGrade:
    """Everything the grader found about one submission."""

    name: str
    path: str
    lab: str | None = None
    seed: int | None = None
    results: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what went wrong while running the notebook
    error: str | None = None  # set when the submission could not be graded at all
    elapsed_s: float = 0.0

    @property
    def score(self) -> float:
        return sum(result.points for result in self.results)

    @property
    def max_score(self) -> float:
        return sum(result.max_points for result in self.results)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the JSON report."""
        return {
            "submission": self.name,
            "path": self.path,
            "lab": self.lab,
            "seed": self.seed,
            "score": self.score,
            "max_score": self.max_score,
            "error": self.error,
            "notes": self.notes,
            "elapsed_s": round(self.elapsed_s, 2),
            "exercises": [result.to_dict() for result in self.results],
        }


def kernel_env() -> dict[str, str]:
    """The environment for a submission's kernel: the grader's own, less any variable whose name
    suggests a secret (the learner's code runs there), with the folder holding this labkit first
    on PYTHONPATH so the kernel imports the same labkit, and exercise specs, as the grader."""
    env = {name: value for name, value in os.environ.items() if not _SECRET_NAME.search(name)}
    labkit_parent = str(Path(labkit.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(part for part in (labkit_parent, env.get("PYTHONPATH")) if part)
    return env


def setup_code(lab: str) -> str:
    """Code for a fresh kernel: import the grader's agent and the lab's exercise specs (leaves no names behind)."""
    return f"__import__('labkit.grading.kernel_side').grading.checks.exercises_for_lab({lab!r});\n"


def load_attempt(path: Path) -> Attempt:
    """What the kernel saved for one exercise, loaded without running any code from it."""
    if not path.is_file():
        return Attempt(ERROR, "the grader got no result back from the kernel for this exercise")
    try:
        record = torch.load(path, weights_only=True)
    except Exception:
        return Attempt(
            ERROR,
            "the result from the kernel could not be loaded safely "
            "(only tensors, numbers, strings and lists are accepted)",
        )
    if not isinstance(record, dict) or record.get("status") not in _RECORD_STATUSES:
        return Attempt(
            ERROR, "the result from the kernel is not in the grader's format (was labkit changed by the notebook?)"
        )
    return Attempt(record["status"], str(record.get("message", "")), record.get("outputs"))


def _cell_note(position: int, source: str, outcome: ks.Outcome) -> str:
    first_line = source.strip().splitlines()[0]
    shown = first_line if len(first_line) <= 40 else first_line[:37] + "..."
    return f"cell {position} ({shown!r}): {outcome.status}: {outcome.detail}"


@contextmanager
def _scratch_dir(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _exercises(lab: str, *, missing_ok: bool = False) -> list[Exercise]:
    try:
        return exercises_for_lab(lab)
    except ValueError as error:
        if missing_ok:
            return []
        raise SubmissionError(str(error)) from None


class Grader:
    """Grades submissions with one seed per run; the oracle's outputs are computed once per exercise."""

    def __init__(self, settings: GradeSettings, seed: int | None = None) -> None:
        self.settings = settings
        self.seed = secrets.randbits(63) if seed is None else seed
        self._expected: dict[str, Any] = {}
        self._expected_lock = threading.Lock()

    def expected(self, exercise: Exercise) -> Any:
        """The oracle's outputs for this run's seed, computed once per exercise."""
        with self._expected_lock:
            if exercise.id not in self._expected:
                self._expected[exercise.id] = expected_outputs(exercise, self.seed)
            return self._expected[exercise.id]

    def grade(self, path: Path, name: str) -> SubmissionGrade:
        """Grade one submission; a file that cannot be graded gives an entry with `error` set."""
        grade = SubmissionGrade(name=name, path=str(path), lab=self.settings.lab, seed=self.seed)
        started = time.monotonic()
        try:
            notebook = read_notebook(path)
            grade.lab = grade.lab or infer_lab(notebook)
            self._run_and_judge(notebook, _exercises(grade.lab), grade)
        except SubmissionError as error:
            grade.error = str(error)
        except Exception as error:  # keep grading the others; the report says what broke
            grade.error = f"the grader failed on this submission: {type(error).__name__}: {error}"
        if grade.error and grade.lab:  # still give every exercise a row, so the class table lines up
            judged = {result.exercise for result in grade.results}
            grade.results += [
                verdict(exercise, NOT_RUN, f"not graded: {grade.error}")
                for exercise in _exercises(grade.lab, missing_ok=True)
                if exercise.id not in judged
            ]
        grade.elapsed_s = time.monotonic() - started
        return grade

    def _run_and_judge(
        self, notebook: nbformat.NotebookNode, exercises: list[Exercise], grade: SubmissionGrade
    ) -> None:
        settings = self.settings
        with (
            _scratch_dir("labkit-run-") as workdir,
            ks.KernelSession(
                workdir,
                cell_timeout=settings.cell_timeout,
                notebook_budget=settings.total_timeout,
                kernel_name=settings.kernel_name,
                env=kernel_env(),
                setup_code=setup_code(grade.lab),
            ) as session,
        ):
            for position, source in code_cells(notebook):
                outcome = session.run_notebook_cell(source)
                if outcome.status != ks.RAN:
                    grade.notes.append(_cell_note(position, source, outcome))
            # Made only now, after the notebook ran, so its code cannot know the path.
            with _scratch_dir("labkit-results-") as results_dir:
                for exercise in exercises:
                    result_path = results_dir / f"{secrets.token_hex(16)}.pt"
                    outcome = session.run_grader_code(attempt_code(exercise.id, self.seed, str(result_path)))
                    if outcome.status == ks.RAN:
                        grade.results.append(judge(exercise, load_attempt(result_path), self.expected(exercise)))
                    else:
                        detail = (
                            outcome.detail
                            if outcome.status != ks.RAISED
                            else f"running your functions failed: {outcome.detail}"
                        )
                        grade.results.append(verdict(exercise, _GRADER_CODE_PROBLEMS[outcome.status], detail))
            if session.setup_problem:
                grade.notes.append(f"the grader's setup code failed in the kernel: {session.setup_problem.detail}")
            if session.restarts:
                grade.notes.append(f"the kernel was restarted {session.restarts} time(s)")


def grade_submissions(
    paths: Sequence[Path], settings: GradeSettings, seed: int | None = None, jobs: int = 1
) -> list[SubmissionGrade]:
    """Grade every submission with one secret seed for the whole run, `jobs` kernels at a time.

    Threads are enough: the learner's code runs in the kernels, and the grader
    itself mostly waits for them.
    """
    grader = Grader(settings, seed)
    pairs = list(zip(paths, submission_names(paths)))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        running = pool.map(lambda pair: grader.grade(*pair), pairs)
        return list(tqdm(running, total=len(pairs), desc="grading", unit="notebook", disable=None))
