"""The autograder: run each submission in its own sandboxed kernel, then judge it outside.

Before any learner code runs, the grader imports each lab's checks, computes the first
submission's expected answers (so the model and every module the oracles need are loaded,
and no oracle runs for nothing) and starts the judging processes. Then, per submission: read the notebook (a broken
file becomes an error entry), draw its own secret seed, compute its expected answers,
and run its code cells in a `KernelSession` inside a private folder (timeouts, crash
recovery), in a bubblewrap sandbox of its own unless told otherwise (with a card of its own
under `--gpu`: gpu_access.py). For each exercise the grader, only now, builds the inputs from
that seed and hands the kernel them (never the seed: request.py); the kernel runs the learner's
functions on them and saves the outputs to a fresh file name in its folder, which the grader
reads at once. Once the kernel and every
process it started are gone, each result is judged in a limited child process against
the expected answer. Nothing the notebook printed or wrote elsewhere is read.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import nbformat
from tqdm.auto import tqdm

import labkit
from labkit.cache import CACHE_ENV, cache_root
from labkit.grading import cgroups, gpu_access, sandbox
from labkit.grading import kernel_session as ks
from labkit.grading.checks import Exercise, exercises_for_lab, lab_module
from labkit.grading.graded_run import GRADED_RUN
from labkit.grading.hint_counts import read_hint_counts, self_reported, tier_count, weigh_hints
from labkit.grading.judge import expected_outputs, verdict, with_source_rule
from labkit.grading.judge_process import judge_taken, start_judges, take_result
from labkit.grading.kernel_device import kernel_device_code, kernels_summary, read_kernel_device
from labkit.grading.kernel_side import attempt_code, hint_counts_code
from labkit.grading.report_text import escaped, report_lines, report_text
from labkit.grading.request import build_request, request_bytes
from labkit.grading.result import CRASHED, ERROR, NOT_RUN, TIMEOUT, CheckResult
from labkit.grading.submissions import (
    SubmissionError,
    code_cells,
    exercise_cell_sources,
    infer_lab,
    lab_notes,
    read_notebook,
    rename_note,
    reserved,
    submission_names,
)
from labkit.models.default_model import ModelCacheError, contents_verified

# The only variables of the grader's environment a kernel gets: what programs, locale, labkit, the
# thread pools and a GPU need. Anything else (a CI job's tokens, keys, database URLs) stays out.
_KERNEL_VARIABLES = re.compile(
    r"PATH|HOME|USER|LOGNAME|LANG|LANGUAGE|LC_[A-Z]+|TZ|TERM|TMPDIR|LD_LIBRARY_PATH|CUDA_VISIBLE_DEVICES"
    r"|LABKIT_[A-Z0-9_]+|(OMP|MKL|OPENBLAS|NUMEXPR|VECLIB_MAXIMUM)_NUM_THREADS|HF_HUB_OFFLINE|TRANSFORMERS_OFFLINE"
)
# What went wrong in the kernel while the grader ran an exercise -> the verdict's status.
_GRADER_CODE_PROBLEMS = {ks.TIMED_OUT: TIMEOUT, ks.DIED: CRASHED, ks.SKIPPED: NOT_RUN, ks.RAISED: ERROR}


@dataclass(frozen=True)
class GradeSettings:
    """Limits and choices for one grading run."""

    cell_timeout: float = 60.0  # seconds per notebook cell, and per exercise when the grader calls it
    total_timeout: float = 600.0  # seconds for all of the notebook's own cells together
    lab: str | None = None  # None: read it from the notebook's exercise tags (never from its metadata alone)
    kernel_name: str = "python3"
    sandbox: bool = True  # each kernel in a bubblewrap sandbox of its own (see sandbox.py)
    memory_bytes: int | None = 8 << 30  # address space a sandboxed kernel may use; None: no limit
    gpu: bool = False  # each kernel gets a card of its own, one submission per card (gpu_access.py)
    setup_timeout: float = 300.0  # seconds for the grader's own imports in a fresh kernel
    hint_penalty: float = 0.0  # fraction of an exercise's points taken per hint shown (0: reported only)


GRADED = "graded"
NOT_GRADED = "not_graded"  # every exercise 0 points, NOT RUN, with the reason


@dataclass
class SubmissionGrade:
    """Everything the grader found about one submission."""

    name: str
    path: str
    lab: str | None = None
    seed: int | None = None  # this submission's own secret seed
    results: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what else it must know: a rename, cells that failed, ...
    error: str | None = None  # set when the submission could not be graded at all
    elapsed_s: float = 0.0
    kernels: str | None = None  # "compiled" or "interpreted", as its kernel reported (kernel_device.py)
    cuda_device: str | None = None  # the CUDA card its kernel saw, if any

    @property
    def status(self) -> str:
        """GRADED, or NOT_GRADED when the submission could not be graded at all (`error` says why)."""
        return GRADED if self.error is None else NOT_GRADED

    @property
    def score(self) -> float:
        return sum(result.points for result in self.results)

    @property
    def max_score(self) -> float:
        return sum(result.max_points for result in self.results)

    def as_reported(self) -> SubmissionGrade:
        """This grade with every text the submission could control made fit for a report (report_text.py)."""
        return replace(
            self,
            path=report_text(self.path, keep_newlines=False),
            lab=self.lab and report_text(self.lab, keep_newlines=False),
            results=[replace(result, message=report_text(result.message)) for result in self.results],
            notes=report_lines(self.notes),
            error=self.error and report_text(self.error),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the JSON report."""
        return {
            "submission": self.name,
            "status": self.status,
            "path": self.path,
            "lab": self.lab,
            "seed": self.seed,
            "score": self.score,
            "max_score": self.max_score,
            "error": self.error,
            "notes": self.notes,
            "elapsed_s": round(self.elapsed_s, 2),
            "kernels": self.kernels,
            "cuda_device": self.cuda_device,
            "exercises": [result.to_dict() for result in self.results],
        }


def kernel_env(sandboxed: bool = False) -> dict[str, str]:
    """The environment for a submission's kernel: only the allow-listed variables of the grader's own
    (the learner's code runs there, so a secret in the grader's environment must not), with the
    folder holding this labkit first on PYTHONPATH so the kernel imports the same labkit, and
    exercise specs, as the grader, and the model cache named explicitly (a sandboxed kernel has its
    own HOME and its own /tmp)."""
    env = {name: value for name, value in os.environ.items() if _KERNEL_VARIABLES.fullmatch(name)}
    labkit_parent = str(Path(labkit.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(part for part in (labkit_parent, os.environ.get("PYTHONPATH")) if part)
    env[CACHE_ENV] = str(cache_root())
    env[GRADED_RUN] = "1"  # labkit.check, passed and hint leave the checking to the grader (graded_run.py)
    if sandboxed:
        env.pop("TMPDIR", None)
    return env


def setup_code() -> str:
    """Code for a fresh kernel: import the grader's agent (leaves no names behind; no torch, `kernel_side.py`).
    Never the lab's checks: the kernel gets each exercise's inputs and run, not its oracle (request.py)."""
    return "__import__('labkit.grading.kernel_side');\n"


def _write_request(folder: Path, exercise: Exercise, seed: int) -> str:
    """Write the exercise's request (inputs built here from the seed) to a fresh name in `folder`; return the name."""
    name = f"request-{secrets.token_hex(16)}.pkl"
    descriptor = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(descriptor, "wb") as file:
        file.write(request_bytes(build_request(exercise, seed)))
    return name


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
        sandbox.remove_tree(path)


def _exercises(lab: str, *, missing_ok: bool = False) -> list[Exercise]:
    try:
        return exercises_for_lab(lab)
    except ValueError as error:
        if missing_ok:
            return []
        raise SubmissionError(str(error)) from None


def labs_of(paths: Sequence[Path], lab: str | None) -> set[str]:
    """The labs a run will grade: `lab` if given, else each readable notebook's own."""
    if lab:
        return {lab}
    labs = set()
    for path in paths:
        try:
            labs.add(infer_lab(read_notebook(path)))
        except SubmissionError:  # reported when that submission is graded
            continue
    return labs


@dataclass(frozen=True)
class Private:
    """What a submission has of its own while it is graded: its folder, its sockets' folder, its cgroups,
    and its card under --gpu."""

    folder: Path
    transport: Path
    cgroup_procs: list[Path]
    card: gpu_access.CardAccess | None = None


class SetupError(Exception):
    """The run cannot start: no sandbox, or a model cache that is damaged or unreadable (the message says the fix)."""


class Grader:
    """Grades submissions, each with its own secret seed, private folder and (by default) sandbox."""

    def __init__(self, settings: GradeSettings, seed: int | None = None) -> None:
        self.settings = settings
        self.run_seed = seed  # given: every submission's seed follows from it and its name, to repeat a run
        self._oracle_lock = threading.Lock()  # one oracle at a time: they share the model and the cores
        self._cards: gpu_access.CardPool | None = None  # under --gpu: the cards, handed out one submission each
        self._seeds: dict[str, int] = {}  # submission name -> its seed, drawn once
        self._prepared: dict[int, dict[str, Any]] = {}  # seed -> {exercise id: expected answer} made by prepare

    def prepare(self, labs: set[str], first: tuple[str, Path] | None = None) -> None:
        """Everything judging needs, made before any learner code runs: each lab's checks imported, the
        judging processes started with them, and the expected answers of submission `first` (its name and
        path: the first to be graded) computed under its own seed, for its own lab only: kept, they are its
        answers, so no oracle runs only to load what the oracles need (another lab's load theirs when graded,
        its model checked then as here: `grade`)."""
        if self.settings.sandbox and (problem := sandbox.sandbox_problem()):
            raise SetupError(f"no sandbox can be made here: {problem}")
        if self.settings.gpu:  # the cards, once a cgroup is known to hold a sandbox's memory without --as
            try:
                self._cards = gpu_access.CardPool(gpu_access.usable_gpus(self.settings.sandbox))
            except gpu_access.GpuRefused as error:
                raise SetupError(str(error)) from None
        modules = []
        for lab in sorted(labs):
            try:
                modules.append(lab_module(lab))
            except ValueError:  # an unknown lab: reported per submission
                continue
        seed, first_labs = (self.seed_for(first[0]), labs_of(first[1:], self.settings.lab)) if first else (0, set())
        try:
            with contents_verified():  # a model the oracles load must match its conversion's checksums
                self._prepared[seed] = {
                    e.id: expected_outputs(e, seed) for lab in first_labs for e in _exercises(lab, missing_ok=True)
                }
        except ModelCacheError as error:
            raise SetupError(str(error)) from None
        if self.settings.sandbox and (hidden := sandbox.unreadable_in_sandbox(cache_root())):
            raise SetupError(
                f"the sandboxed kernels could not read {hidden[0]} (and {len(hidden) - 1} more files in the "
                f"model cache).\nFix: chmod -R a+rX '{cache_root()}'"
            )
        start_judges(modules)

    def concurrent_jobs(self, jobs: int) -> int:
        """How many submissions may be graded at once: `jobs`, and under --gpu at most one per card."""
        return min(jobs, self._cards.size) if self._cards else jobs

    def seed_for(self, name: str) -> int:
        """A submission's own seed, the same each time it is asked for: secret and fresh, or derived from the
        run's seed and its name."""
        if name not in self._seeds:
            if self.run_seed is None:
                self._seeds[name] = secrets.randbits(63)
            else:
                self._seeds[name] = (
                    int.from_bytes(hashlib.sha256(f"{self.run_seed}:{name}".encode()).digest()[:8], "big") >> 1
                )
        return self._seeds[name]

    def grade(self, path: Path, name: str, slot: int = 0) -> SubmissionGrade:
        """Grade one submission (`slot` numbers its sandbox user); a file that cannot be graded gives
        an entry with `error` set."""
        seed = self.seed_for(name)
        grade = SubmissionGrade(name=name, path=str(path), lab=self.settings.lab, seed=seed)
        grade.notes += filter(None, [rename_note(path, name)])
        if self.settings.hint_penalty:
            grade.notes.append(self_reported(self.settings.hint_penalty))
        started = time.monotonic()
        try:
            notebook = read_notebook(path)
            grade.lab = grade.lab or infer_lab(notebook)
            grade.notes += lab_notes(notebook, grade.lab)
            exercises = _exercises(grade.lab)
            with self._oracle_lock, contents_verified():  # before this submission's code runs
                prepared = self._prepared.pop(seed, {})  # its answers, if prepare made them (the first submission's)
                expected = {e.id: prepared[e.id] if e.id in prepared else expected_outputs(e, seed) for e in exercises}
            self._run_and_judge(path, notebook, exercises, expected, grade, seed, sandbox.sandbox_uid(1 + slot))
        except SubmissionError as error:
            grade.error = report_text(str(error))
        except Exception as error:  # keep grading the others; the report says what broke
            grade.error = report_text(f"the grader failed on this submission: {type(error).__name__}: {error}")
        if grade.error and grade.lab:  # still give every exercise a row, so the class table lines up
            judged = {result.exercise for result in grade.results}
            grade.results += [
                verdict(exercise, NOT_RUN, f"not graded: {grade.error}")
                for exercise in _exercises(grade.lab, missing_ok=True)
                if exercise.id not in judged
            ]
        grade.elapsed_s = time.monotonic() - started
        return grade

    @contextmanager
    def _card(self) -> Iterator[gpu_access.CardAccess | None]:
        """Under --gpu, a card no other submission is using (waits for one); else None."""
        if self._cards is None:
            yield None
            return
        with self._cards.take() as card:
            yield card

    @contextmanager
    def _private_folder(self, uid: int) -> Iterator[Private]:
        """The submission's folder, its sockets' folder, the cgroups its sandbox joins (none without a
        sandbox, or where the machine has no cgroup tree to write) and its card; the cgroups go last, once
        nothing of it runs, and the card after them."""
        if self.settings.sandbox:
            limits = self._limits(0)
            with (
                self._card() as card,
                cgroups.submission_cgroup(f"labkit-{uid}", limits.max_tasks, limits.memory_bytes) as procs,
                sandbox.sandbox_folder(uid) as folder,
                sandbox.transport_folder(uid) as transport,
            ):
                if card is not None and not procs:  # no address-space limit either: nothing would bound it
                    raise RuntimeError("no cgroup could be made to limit its memory, which --gpu needs")
                yield Private(folder, transport, procs, card)
        else:
            with self._card() as card, _scratch_dir("labkit-run-") as folder:
                yield Private(folder, folder, [], card)

    def _wall_clock_limit(self, exercises: int) -> float:
        """A submission's whole time: setup once, the notebook's budget, a cell timeout per exercise, one for the
        hint counts and one for the kernel's device."""
        settings = self.settings
        return settings.setup_timeout + settings.total_timeout + settings.cell_timeout * (exercises + 2)

    def _limits(self, exercises: int) -> sandbox.Limits:
        cpu_seconds = math.ceil(self._wall_clock_limit(exercises)) * (os.cpu_count() or 1)
        return sandbox.Limits(self.settings.memory_bytes, cpu_seconds)

    def _session(self, private: Private, uid: int, exercises: int) -> ks.KernelSession:
        settings = self.settings
        prefix = owner = None
        env = kernel_env(settings.sandbox) | (private.card.env if private.card else {})
        if settings.sandbox:
            limits = self._limits(exercises)
            gpu_binds = private.card.binds if private.card else ()
            prefix = sandbox.sandbox_command(
                private.folder, uid, limits, private.cgroup_procs, private.transport, gpu_binds
            )
            owner = uid if sandbox.switches_user() else None
        return ks.KernelSession(
            private.folder,
            cell_timeout=settings.cell_timeout,
            notebook_budget=settings.total_timeout,
            kernel_name=settings.kernel_name,
            env=env,
            setup_code=setup_code(),
            setup_timeout=settings.setup_timeout,
            launch_prefix=prefix,
            owner_uid=owner,
            transport=private.transport,
            wall_clock_limit=self._wall_clock_limit(exercises),
        )

    def _run_and_judge(
        self,
        path: Path,
        notebook: nbformat.NotebookNode,
        exercises: list[Exercise],
        expected: dict[str, Any],
        grade: SubmissionGrade,
        seed: int,
        uid: int,
    ) -> None:
        settings = self.settings
        taken: dict[str, bytes] = {}  # exercise id -> the result file's bytes, read as soon as its exercise ran
        with self._private_folder(uid) as private:
            folder = private.folder
            shutil.copyfile(path, folder / "submission.ipynb")  # its own notebook, for code that reads it
            with self._session(private, uid, len(exercises)) as session:
                for position, source in code_cells(notebook):
                    outcome = session.run_notebook_cell(source)
                    if outcome.status != ks.RAN:
                        grade.notes.append(_cell_note(position, source, outcome))
                for exercise in exercises:
                    # Named only now, after the notebook ran, so its code cannot know it in advance; each
                    # result is taken before the next request arrives, so nothing a later one carries can change it.
                    name = f"result-{secrets.token_hex(16)}.pt"
                    with self._oracle_lock:  # building the inputs may use the model, as the oracles do
                        request = _write_request(folder, exercise, seed)
                    outcome = session.run_grader_code(attempt_code(str(folder / request), str(folder / name)))
                    with contextlib.suppress(OSError):  # the kernel may have put something else there
                        (folder / request).unlink()
                    if outcome.status != ks.RAN:
                        grade.results.append(_kernel_problem(exercise, outcome))
                    elif isinstance(result := take_result(exercise, folder, name, expected[exercise.id]), bytes):
                        taken[exercise.id] = result
                    else:
                        grade.results.append(result)
                hints_file = f"hints-{secrets.token_hex(16)}.json"
                session.run_grader_code(hint_counts_code(str(folder / hints_file)))  # no file: no hints counted
                device_file = f"device-{secrets.token_hex(16)}.json"
                session.run_grader_code(kernel_device_code(str(folder / device_file)))  # no file: not reported
                if session.setup_problem:
                    grade.notes.append(f"the grader's setup code failed in the kernel: {session.setup_problem.detail}")
                if session.restarts:
                    grade.notes.append(f"the kernel was restarted {session.restarts} time(s)")
            if settings.sandbox and sandbox.switches_user():
                sandbox.kill_processes_of(uid)  # nothing it started may still touch its results
            sources = exercise_cell_sources(notebook)  # read as data, here
            for exercise in exercises:
                if exercise.id in taken:
                    result = judge_taken(exercise, taken[exercise.id], expected[exercise.id], settings.cell_timeout)
                    grade.results.append(with_source_rule(exercise, result, sources.get(exercise.id, "")))
            hints = read_hint_counts(folder / hints_file)
            if device := read_kernel_device(folder / device_file):
                grade.kernels, grade.cuda_device = device.kernels, device.cuda_device
        grade.results = [  # no more than the exercise has: a sandboxed kernel counts hints it cannot show
            weigh_hints(result, min(hints.get(result.exercise, 0), tier_count(result.exercise)), settings.hint_penalty)
            for result in grade.results
        ]
        order = [exercise.id for exercise in exercises]
        grade.results.sort(key=lambda result: order.index(result.exercise))


def _kernel_problem(exercise: Exercise, outcome: ks.Outcome) -> CheckResult:
    """The verdict when running an exercise in the kernel went wrong (timeout, crash, an error)."""
    detail = outcome.detail if outcome.status != ks.RAISED else f"running your functions failed: {outcome.detail}"
    return verdict(exercise, _GRADER_CODE_PROBLEMS[outcome.status], detail)


def grade_submissions(
    paths: Sequence[Path],
    settings: GradeSettings,
    seed: int | None = None,
    jobs: int = 1,
    names: Sequence[str] | None = None,
) -> list[SubmissionGrade]:
    """Grade every submission, `jobs` kernels at a time; when it returns, no process of the run is left.

    `names` are the report names (default: `submission_names(paths)`); a shard passes those of the
    whole class, so that a submission has the same name whichever shard grades it.

    Threads are enough: the learner's code runs in the kernels and the judging in child
    processes, and the grader itself mostly waits for them.
    """
    grader = Grader(settings, seed)
    jobs_list = list(zip(paths, names or submission_names(paths), range(len(paths))))
    first = (jobs_list[0][1], jobs_list[0][0]) if jobs_list else None  # its name and path
    grader.prepare(labs_of(paths, settings.lab), first)
    with ThreadPoolExecutor(max_workers=grader.concurrent_jobs(jobs)) as pool:
        running = pool.map(lambda job: grader.grade(*job), jobs_list)
        return list(tqdm(running, total=len(jobs_list), desc="grading", unit="notebook", disable=None))


def class_summary(grades: Sequence[SubmissionGrade], hint_penalty: float = 0.0) -> str:
    """The end of a run: how many submissions were graded and how many could not be; which were renamed
    (a learner looks for their report under their file's name); the labs, when not all were graded on one;
    whose word the hint counts are, when they cost."""
    refused = [grade.name for grade in grades if grade.status == NOT_GRADED]
    line = f"{len(grades) - len(refused)} of {len(grades)} submissions graded"
    if refused:
        shown = ", ".join(refused[:10]) + (f" and {len(refused) - 10} more" if len(refused) > 10 else "")
        line += f"; {len(refused)} could not be (0 points; the reason is in each one's report): {shown}"
    renamed = [grade for grade in grades if reserved(Path(grade.path).stem)]
    if renamed:
        shown = ", ".join(f"'{escaped(Path(grade.path).name)}' as {grade.name}" for grade in renamed)
        line += f"\nrenamed, since the grader writes files of those names itself: {shown}"
    labs = Counter(grade.lab for grade in grades if grade.lab)
    if len(labs) > 1:  # only without --lab: each notebook's tags chose
        shown = ", ".join(f"{lab} ({count})" for lab, count in sorted(labs.items()))
        line += (
            f"\ngraded against {len(labs)} labs, as their exercise tags say: {shown}; pass --lab to grade all on one"
        )
    if hint_penalty:
        line += "\n" + self_reported(hint_penalty)
    if kernels := kernels_summary(grades):
        line += "\n" + kernels
    return line
