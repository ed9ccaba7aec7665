"""Grade submitted lab notebooks: run each in a sandboxed kernel, judge it outside, write reports.

    labkit grade SUBMISSION.ipynb [...] --out DIR [--lab LAB] [--cell-timeout S] [--total-timeout S] [--jobs N]
                 [--hint-penalty F] [--shard K/N] [--gpu]
    labkit grade merge SHARD_DIR [...] --out DIR
    labkit grade gradebook REPORT_DIR --roster ROSTER.csv --out DIR [--assignment NAME] [--missing-zero]

A class too big for one machine is graded in shards: the same command with --shard K/N on each
of N machines grades the submissions whose name hashes to shard K, and `labkit grade merge` checks
the shards' reports and writes the reports one run over the whole class would have written.
`labkit grade gradebook` turns a run's (or a merge's) reports into DIR/gradebook.csv for Canvas's
gradebook import and DIR/feedback/ID.md per learner, through the instructor's roster
(columns file, student, id, section; optionally sis_user_id).

With --gpu each submission's sandbox gets an NVIDIA card of its own, one submission per card at a
time (gpu_access.py); each report and the class summary say whether its kernels ran compiled or
interpreted.

Each exercise's report says how many hints (labkit.hint) the notebook showed for it; they cost
nothing unless --hint-penalty F takes F x the exercise's points per hint from a passed exercise.

Writes DIR/NAME.json, DIR/NAME.xml (JUnit) and DIR/NAME.md for each submission,
DIR/grades.csv for all of them, DIR/run.json (what was run), DIR/similarity.html and DIR/similarity.json
(each exercise cell compared with labkit's answer and the classmates'; --no-similarity skips them; they
flag for review, never change a grade) and DIR/checksums.json last. Exits 0 once everything is
graded, whatever the scores; 2 when the command itself is misused (an unknown lab, a
bad timeout), when it would grade several submissions with no sandbox to keep them apart, or when
--gpu finds no card, or no cgroup to limit a sandbox's memory in place of its address space.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from labkit.grading.cgroups import cgroup_support
from labkit.grading.checks import exercises_for_lab
from labkit.grading.report_text import escaped

if TYPE_CHECKING:
    from labkit.grading.shards import Shard


SUBCOMMANDS = ("merge", "gradebook")  # the first positional, written bare as one of these, names that subcommand


class GradeUsageError(Exception):
    """A misused `labkit grade` (a bad option, a refused merge, no sandbox for a class): `run` prints
    `error: MESSAGE` and exits 2."""


class _Submissions(argparse.Action):
    """The positionals, as paths; `task` is the subcommand their first one names when written bare (`merge`,
    `gradebook`; `./merge` is a notebook of that name), else "grade"."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.task = values[0] if values[0] in SUBCOMMANDS else "grade"
        setattr(namespace, self.dest, [Path(value) for value in values])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `labkit grade` options."""
    _add_grading_arguments(parser)
    _add_gradebook_arguments(parser)
    _add_safety_arguments(parser)


def _add_grading_arguments(parser: argparse.ArgumentParser) -> None:
    """What to grade, against which lab, where the reports go, and each run's limits."""
    parser.add_argument(
        "submissions",
        nargs="+",
        action=_Submissions,
        help="notebooks to grade (or: merge SHARD_DIR ...; or: gradebook REPORT_DIR)",
    )
    parser.add_argument("--out", required=True, type=Path, help="folder for the reports (created if needed)")
    parser.add_argument("--lab", help="lab to grade against, e.g. lab2 (default: read from each notebook)")
    parser.add_argument(
        "--cell-timeout", type=float, default=60.0, help="seconds per cell and per exercise (default 60)"
    )
    parser.add_argument(
        "--total-timeout", type=float, default=600.0, help="seconds for all of a notebook's cells (default 600)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        help="repeat a run: each submission's seed follows from this and its name (default: a secret one each)",
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="submissions graded at the same time, one kernel each (default 1)"
    )
    parser.add_argument("--kernel", default="python3", help="Jupyter kernel to run submissions in (default python3)")
    parser.add_argument(
        "--memory-gb",
        type=float,
        default=8.0,
        help="address space each sandboxed kernel may use, in GiB; 0: no limit (default 8)",
    )
    parser.add_argument(
        "--hint-penalty",
        type=float,
        default=0.0,
        help="fraction of an exercise's points taken per labkit.hint shown, e.g. 0.1 (default 0: hints are "
        "only reported)",
    )
    parser.add_argument(
        "--shard",
        default="1/1",
        help="grade only shard K of N of the submissions (by a hash of each name), e.g. 2/3; merge the N "
        "folders with `labkit grade merge` (default 1/1: all)",
    )


def _add_gradebook_arguments(parser: argparse.ArgumentParser) -> None:
    """`labkit grade gradebook`'s: the roster and the column it fills."""
    parser.add_argument("--roster", type=Path, help="gradebook: the roster CSV (file, student, id, section)")
    parser.add_argument(
        "--assignment", help="gradebook: the assignment column's header, e.g. 'Lab 2 (1234)' (default: the lab)"
    )
    parser.add_argument(
        "--missing-zero",
        action="store_true",
        help="gradebook: give a learner with no graded submission 0 points (listed) instead of stopping",
    )


def _add_safety_arguments(parser: argparse.ArgumentParser) -> None:
    """What guards the grading: the similarity report, and the sandbox each kernel runs in."""
    parser.add_argument(
        "--no-similarity",
        action="store_true",
        help="skip the similarity report (similarity.html, the flags column of grades.csv): copying and code "
        "that reaches around a check are then not looked for",
    )
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="give each submission's sandbox an NVIDIA card of its own (device nodes, driver files; a cgroup "
        "memory limit instead of the address-space one, so root with a writable cgroup tree), one submission "
        "per card at a time, whatever --jobs says",
    )
    parser.add_argument(
        "--no-sandbox",
        action="store_true",
        help="run kernels without bubblewrap: each submission can then read and change the others' work",
    )


def _refuse_without_sandbox(count: int, problem: str) -> str:
    return (
        f"cannot grade {count} submissions together: no sandbox can be made here ({problem}).\n"
        "Without one, each notebook's code runs with the grader's rights and can read, copy or rewrite the\n"
        "other submissions, their results and the reports.\n"
        "Fix: install bubblewrap (apt-get install bubblewrap) on a machine that allows user namespaces or\n"
        "runs the grader as root; or grade one submission per command; or pass --no-sandbox to accept the risk."
    )


def _merge(args: argparse.Namespace) -> int:
    from labkit.grading.shards import MergeError, merge_shards

    folders = args.submissions[1:]
    if not folders:
        raise GradeUsageError(
            "labkit grade merge needs the shards' output folders: labkit grade merge DIR1 DIR2 ... --out DIR"
        )
    try:
        manifest, digest = merge_shards(folders, args.out)
    except MergeError as error:
        raise GradeUsageError(str(error)) from None
    print(
        f"merged {len(folders)} shards into {args.out}/ (class table: grades.csv); sha256 of {manifest.name}: {digest}"
    )
    return 0


def _gradebook(args: argparse.Namespace) -> int:
    from labkit.grading.gradebook import write_gradebook

    if len(args.submissions) != 2 or args.roster is None:
        raise GradeUsageError("write it labkit grade gradebook REPORT_DIR --roster ROSTER.csv --out DIR")
    try:
        book = write_gradebook(args.submissions[1], args.roster, args.out, args.assignment, args.missing_zero)
    except (ValueError, OSError) as error:
        raise GradeUsageError(str(error)) from None
    for learner in book.absent:
        print(
            f"0 points, no graded submission: {escaped(learner.student)} ({escaped(learner.id)}, roster row "
            f"{learner.row})"
        )
    print(f"gradebook for {len(book.feedback)} learners in {book.csv_path}; their feedback in {args.out}/feedback/")
    return 0


def _require_labs_extra() -> None:
    """Import the grader, here rather than at the top, so `labkit --help` works without the [labs] extra."""
    try:
        import labkit.grading.grader  # noqa: F401  (its imports are the extra's)
    except ImportError as error:
        raise GradeUsageError(f"labkit grade needs {error.name}; install it with: pip install 'labkit[labs]'") from None


def _check_options(args: argparse.Namespace) -> Shard:
    """The shard to grade, once every grading option is known to be usable."""
    from labkit.grading.shards import parse_shard

    try:
        shard = parse_shard(args.shard)
    except ValueError as error:
        raise GradeUsageError(str(error)) from None
    if args.cell_timeout <= 0 or args.total_timeout <= 0:
        raise GradeUsageError("--cell-timeout and --total-timeout must be positive numbers of seconds")
    if args.jobs < 1:
        raise GradeUsageError("--jobs must be at least 1")
    if args.lab:
        try:
            exercises_for_lab(args.lab)
        except ValueError as error:
            raise GradeUsageError(f"--lab {args.lab}: {error}") from None
    if not 0 <= args.hint_penalty <= 1:
        raise GradeUsageError(
            "--hint-penalty must be between 0 (hints only reported) and 1 (a hint costs all the points)"
        )
    if args.memory_gb < 0:
        raise GradeUsageError("--memory-gb must be 0 (no limit) or a positive number of GiB")
    return shard


def _gpu_jobs(jobs: int, use_sandbox: bool) -> int:
    """Under --gpu: how many submissions at once (one per card), once the cards and, for sandboxes, a
    cgroup memory limit are known to be there; GradeUsageError naming what is missing otherwise."""
    from labkit.grading.gpu_access import GpuRefused, usable_gpus

    try:
        cards = usable_gpus(use_sandbox).cards
    except GpuRefused as error:
        raise GradeUsageError(str(error)) from None
    models = ", ".join(dict.fromkeys(card.model for card in cards))
    print(f"--gpu: {len(cards)} card(s) ({models}), each graded with one submission at a time")
    if jobs > len(cards):
        print(f"--jobs {jobs} lowered to {len(cards)}: one submission per card")
    return min(jobs, len(cards))


def _grade(args: argparse.Namespace) -> int:
    """Grade this shard's submissions, write the reports, print one line per submission."""
    from labkit.grading.grader import GradeSettings, SetupError, class_summary, grade_submissions
    from labkit.grading.reports import write_reports
    from labkit.grading.sandbox import sandbox_problem
    from labkit.grading.shards import run_info, shard_of
    from labkit.grading.similarity import class_similarity
    from labkit.grading.submissions import submission_names

    shard = _check_options(args)
    class_names = submission_names(args.submissions)  # of the whole class, so no name depends on the shard
    mine = [i for i, name in enumerate(class_names) if shard_of(name, shard.count) == shard.index]
    paths, names = [args.submissions[i] for i in mine], [class_names[i] for i in mine]
    use_sandbox = not args.no_sandbox
    if use_sandbox and (problem := sandbox_problem()):
        if len(paths) > 1:
            raise GradeUsageError(_refuse_without_sandbox(len(paths), problem))
        print(f"note: grading the one submission without a sandbox: {problem}")
        use_sandbox = False
    jobs = _gpu_jobs(args.jobs, use_sandbox) if args.gpu else args.jobs
    # The folder of the `labkit` script comes first on sys.path; nothing should be imported from there.
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != Path(sys.argv[0]).resolve().parent]
    settings = GradeSettings(
        cell_timeout=args.cell_timeout,
        total_timeout=args.total_timeout,
        lab=args.lab,
        kernel_name=args.kernel,
        sandbox=use_sandbox,
        memory_bytes=int(args.memory_gb * 2**30) or None,
        gpu=args.gpu,
        hint_penalty=args.hint_penalty,
    )
    if use_sandbox:
        print(f"sandbox limits per submission: {cgroup_support()}")
    if shard.count > 1:
        print(f"shard {shard}: grading {len(paths)} of the {len(class_names)} submissions")
    try:
        grades = grade_submissions(paths, settings, seed=args.seed, jobs=jobs, names=names) if paths else []
    except SetupError as error:
        raise GradeUsageError(str(error)) from None
    # Only now, with every kernel and every process they started gone, are the reports written.
    for grade in grades:  # one line each, whatever the learner's text holds (report_text.escaped)
        outcome = grade.error or ", ".join(f"{result.exercise} {result.label}" for result in grade.results)
        print(f"{grade.name}: {grade.score:g} / {grade.max_score:g}  ({escaped(outcome)})")
    print(class_summary(grades, settings.hint_penalty))
    similarity = None if args.no_similarity else class_similarity(grades)  # never raises: a failure is its problem
    if similarity is not None:
        print(similarity.summary())
    run = run_info(settings, args.seed, shard, class_names, names)
    manifest, digest = write_reports(grades, args.out, run, similarity)
    print(f"reports in {args.out}/ (class table: grades.csv); sha256 of {manifest.name}: {digest}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Grade (or merge shards, or write a gradebook), as the first positional says; 2 if misused."""
    try:
        _require_labs_extra()
        return {"grade": _grade, "merge": _merge, "gradebook": _gradebook}[args.task](args)
    except GradeUsageError as error:
        print(f"error: {escaped(str(error), keep_newlines=True)}")
        return 2
