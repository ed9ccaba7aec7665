"""Grade submitted lab notebooks: run each in a fresh kernel, judge it outside, write reports.

    labkit grade SUBMISSION.ipynb [...] --out DIR [--lab LAB] [--cell-timeout S] [--total-timeout S] [--jobs N]

Writes DIR/NAME.json, DIR/NAME.xml (JUnit) and DIR/NAME.md for each submission and
DIR/grades.csv for all of them. Exits 0 once everything is graded, whatever the
scores; 2 when the command itself is misused (an unknown lab, a bad timeout).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from labkit.grading.checks import exercises_for_lab


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `labkit grade` options."""
    parser.add_argument("submissions", nargs="+", type=Path, help="notebooks to grade")
    parser.add_argument("--out", required=True, type=Path, help="folder for the reports (created if needed)")
    parser.add_argument("--lab", help="lab to grade against, e.g. lab2 (default: read from each notebook)")
    parser.add_argument(
        "--cell-timeout", type=float, default=60.0, help="seconds per cell and per exercise (default 60)"
    )
    parser.add_argument(
        "--total-timeout", type=float, default=600.0, help="seconds for all of a notebook's cells (default 600)"
    )
    parser.add_argument(
        "--seed", type=int, help="seed for the grader's inputs, to reproduce a run (default: a fresh secret one)"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="submissions graded at the same time, one kernel each (default 1)"
    )
    parser.add_argument("--kernel", default="python3", help="Jupyter kernel to run submissions in (default python3)")


def run(args: argparse.Namespace) -> int:
    """Grade, write the reports, print one line per submission."""
    try:  # here rather than at the top, so `labkit --help` works without the [labs] extra
        from labkit.grading.grader import GradeSettings, grade_submissions
        from labkit.grading.reports import write_grades_csv, write_submission_reports
    except ImportError as error:
        print(f"error: labkit grade needs {error.name}; install it with: pip install 'labkit[labs]'")
        return 2
    if args.cell_timeout <= 0 or args.total_timeout <= 0:
        print("error: --cell-timeout and --total-timeout must be positive numbers of seconds")
        return 2
    if args.jobs < 1:
        print("error: --jobs must be at least 1")
        return 2
    if args.lab:
        try:
            exercises_for_lab(args.lab)
        except ValueError as error:
            print(f"error: --lab {args.lab}: {error}")
            return 2
    settings = GradeSettings(
        cell_timeout=args.cell_timeout, total_timeout=args.total_timeout, lab=args.lab, kernel_name=args.kernel
    )
    grades = grade_submissions(args.submissions, settings, seed=args.seed, jobs=args.jobs)
    for grade in grades:
        write_submission_reports(grade, args.out)
        outcome = grade.error or ", ".join(f"{result.exercise} {result.label}" for result in grade.results)
        print(f"{grade.name}: {grade.score:g} / {grade.max_score:g}  ({outcome})")
    print(f"reports in {args.out}/; class table: {write_grades_csv(grades, args.out / 'grades.csv')}")
    return 0
