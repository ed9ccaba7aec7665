"""Gradescope's half of a lab: grade the one notebook handed in, with the same judge, into Gradescope's results.json.

Gradescope runs `run_autograder` (written by `labkit make-autograder`) in a container per
submission, with the learner's files in ROOT/submission/ and the results expected in
ROOT/results/results.json (ROOT is /autograder there; `--root` moves it, for a test). This
finds the notebook, grades it as `labkit grade` does (a fresh kernel, in a bubblewrap sandbox
where one can be made, its own secret seed, judged outside the kernel) and writes one Gradescope
test per exercise (name, score, max_score, status, output: the verdict's message, visibility) and
the total. A problem of the instructor's setup (an unknown lab, a damaged model cache) exits 1
without results, so Gradescope shows the autograder failed rather than a grade.

    python -m labkit.grading.gradescope --lab LAB [--root /autograder] [--cell-timeout S] ...
    python -m labkit.grading.gradescope --lab LAB --warm    # in setup.sh: load the model once
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from labkit.grading.checks import exercises_for_lab
from labkit.grading.grader import GradeSettings, SetupError, SubmissionGrade, grade_submissions
from labkit.grading.judge import expected_outputs, verdict
from labkit.grading.report_text import escaped
from labkit.grading.result import NOT_RUN
from labkit.grading.sandbox import sandbox_problem

VISIBILITY = "visible"  # each test's; Gradescope also knows hidden, after_due_date, after_published


def find_notebook(folder: Path) -> tuple[Path | None, str]:
    """The one notebook handed in (checkpoints aside), or None and why not."""
    found = sorted(path for path in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in path.parts)
    if len(found) == 1:
        return found[0], ""
    if not found:
        return None, "no notebook (.ipynb) was handed in: upload your lab notebook"
    names = ", ".join(escaped(str(path.relative_to(folder))) for path in found)
    return None, f"{len(found)} notebooks were handed in ({names}): upload only your lab notebook"


def results_json(grade: SubmissionGrade, output: str, elapsed_s: float) -> dict[str, Any]:
    """Gradescope's results: one test per exercise and the total score."""
    tests = [
        {
            "name": result.exercise,
            "score": result.points,
            "max_score": result.max_points,
            "status": "passed" if result.passed else "failed",
            "output": result.message + (f"\nHints shown: {result.hints_shown}" if result.hints_shown else ""),
            "visibility": VISIBILITY,
        }
        for result in grade.as_reported().results
    ]
    return {
        "score": grade.score,
        "execution_time": round(elapsed_s, 1),
        "output": output,
        "stdout_visibility": "hidden",
        "tests": tests,
    }


def grade_in_layout(root: Path, settings: GradeSettings) -> dict[str, Any]:
    """Grade ROOT/submission's notebook and write ROOT/results/results.json; return what was written."""
    started = time.monotonic()
    exercises = exercises_for_lab(settings.lab)  # an unknown lab is the instructor's error: raises
    path, problem = find_notebook(root / "submission")
    lines = []
    if path is None:
        grade = SubmissionGrade("submission", "", settings.lab)
        grade.results = [verdict(exercise, NOT_RUN, f"not graded: {problem}") for exercise in exercises]
        lines.append(problem)
    else:
        if settings.sandbox and (missing := sandbox_problem()):
            settings = dataclasses.replace(settings, sandbox=False)
            lines.append(f"graded without a sandbox ({missing}): Gradescope's container is this submission's own")
        (grade,) = grade_submissions([path], settings, names=[path.stem])
        reported = grade.as_reported()  # each line below one line, whatever the learner's text holds
        if reported.error:
            lines.append(f"not graded: {escaped(reported.error)}")
        lines += [f"while running the notebook: {escaped(note)}" for note in reported.notes]
    lines.insert(0, f"{grade.score:g} / {grade.max_score:g} points on {settings.lab}")
    results = results_json(grade, "\n".join(lines), time.monotonic() - started)
    out = root / "results" / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m labkit.grading.gradescope", description=__doc__.splitlines()[0])
    parser.add_argument("--lab", required=True)
    parser.add_argument(
        "--root", type=Path, default=Path("/autograder"), help="Gradescope's folder (default /autograder)"
    )
    parser.add_argument("--cell-timeout", type=float, default=60.0)
    parser.add_argument("--total-timeout", type=float, default=600.0)
    parser.add_argument("--memory-gb", type=float, default=8.0)
    parser.add_argument("--hint-penalty", type=float, default=0.0)
    parser.add_argument("--warm", action="store_true", help="only compute each expected answer once (setup.sh)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.warm:
            for exercise in exercises_for_lab(args.lab):
                expected_outputs(exercise, 0)
            return 0
        settings = GradeSettings(
            cell_timeout=args.cell_timeout,
            total_timeout=args.total_timeout,
            lab=args.lab,
            memory_bytes=int(args.memory_gb * 2**30) or None,
            hint_penalty=args.hint_penalty,
        )
        print(grade_in_layout(args.root, settings)["output"])
    except (SetupError, ValueError, OSError) as error:
        print(f"labkit autograder: the instructor's setup failed, no grade written: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
