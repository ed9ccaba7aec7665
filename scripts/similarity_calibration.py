"""Measure the similarity scores of independent honest answers, to set labkit's thresholds (similarity.py).

    python scripts/similarity_calibration.py [tests/fixtures/similarity]

The folder holds one subfolder per exercise id (`lab1.attention/`), each with several honest answers
written apart (`*.py`, the whole exercise cell). For each exercise it prints the highest score an honest
answer gets against labkit's reference and against another honest answer, and how many were too short
to compare; THRESHOLDS and DEFAULT_THRESHOLD must sit above every one of them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from labkit.grading import similarity
from labkit.grading.checks import lab_of
from labkit.grading.reference_sources import lab_references

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "similarity"


def honest_answers(folder: Path) -> dict[str, dict[str, str]]:
    """Exercise id -> {answer's name: its cell}."""
    return {
        exercise.name: {path.stem: path.read_text() for path in sorted(exercise.glob("*.py"))}
        for exercise in sorted(folder.iterdir())
        if exercise.is_dir()
    }


def main(folder: Path) -> None:
    saved = dict(similarity.THRESHOLDS), similarity.DEFAULT_THRESHOLD
    similarity.THRESHOLDS.clear()
    similarity.DEFAULT_THRESHOLD = 0.0  # every pair is listed, with its score
    try:
        print(f"{'exercise':32} {'vs reference':>12} {'vs honest':>10}  too short   threshold")
        for exercise, answers in honest_answers(folder).items():
            lab = lab_of(exercise)
            cells = {f"{exercise}/{name}": (lab, {exercise: source}) for name, source in answers.items()}
            report = similarity.compare_class(cells, lab_references)
            best = {
                kind: max((p.score for p in report.pairs if p.kind == kind), default=0.0)
                for kind in ("reference", "classmate")
            }
            short = [name for name in report.too_short.get(exercise, []) if name != similarity.REFERENCE]
            print(
                f"{exercise:32} {best['reference']:12.2f} {best['classmate']:10.2f}  {len(short):3d} of {len(answers)}"
                f"   {saved[0].get(exercise, saved[1]):.2f}"
            )
    finally:
        similarity.THRESHOLDS.update(saved[0])
        similarity.DEFAULT_THRESHOLD = saved[1]


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURES)
