"""The grader's reports: JSON for machines, JUnit XML for CI, Markdown for people, CSV for the class.

Per submission NAME: NAME.json, NAME.xml and NAME.md; for the whole run: grades.csv
with one row per submission and one column per exercise (and a `flags` column where the
similarity report was made), run.json (what was run: see `shards.run_info`), similarity.html
and similarity.json (`similarity.py`), and last checksums.json with the SHA-256 of every other report, whose
own digest the grader prints: a report changed after the run no longer matches, and a
changed checksums.json no longer matches the printed digest. Files are always written
fresh, over anything else in the folder.
"""

from __future__ import annotations

import csv
import hashlib
import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from labkit.grading.grader import SubmissionGrade
from labkit.grading.kernel_device import KernelDevice
from labkit.grading.report_text import code_block, csv_cell, escaped, report_text, xml_text
from labkit.grading.result import CheckResult
from labkit.grading.similarity import ClassSimilarity
from labkit.grading.similarity_page import write_similarity

RUN_FILE = "run.json"
CHECKSUMS_FILE = "checksums.json"


def _points(value: float) -> str:
    return f"{value:g}"


def to_junit(grade: SubmissionGrade) -> ET.ElementTree:
    """One test suite per submission, one test case per exercise; anything but PASS is a failure."""
    suites = ET.Element("testsuites", name="labkit grade")
    suite = ET.SubElement(suites, "testsuite", name=grade.name, time=f"{grade.elapsed_s:.2f}")
    properties = ET.SubElement(suite, "properties")
    for key, value in (
        ("lab", grade.lab or ""),
        ("score", _points(grade.score)),
        ("max_score", _points(grade.max_score)),
    ):
        ET.SubElement(properties, "property", name=key, value=value)
    failures = 0
    for result in grade.results:
        case = ET.SubElement(suite, "testcase", classname=grade.name, name=result.exercise, time="0")
        if not result.passed:
            failures += 1
            headline = escaped(result.message.split("\n")[0])
            ET.SubElement(case, "failure", message=headline, type=result.status).text = xml_text(result.message)
    errors = 0
    if grade.error:
        errors = 1
        case = ET.SubElement(suite, "testcase", classname=grade.name, name="notebook", time="0")
        ET.SubElement(case, "error", message=escaped(grade.error), type="ungradable")
    if grade.notes:
        ET.SubElement(suite, "system-out").text = xml_text("\n".join(grade.notes))
    tests = len(grade.results) + errors
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    ET.indent(suites)
    return ET.ElementTree(suites)


def to_markdown(grade: SubmissionGrade) -> str:
    """A summary a learner or instructor can read: the score, a table, then each message."""
    lines = [f"# {grade.name}: {_points(grade.score)} / {_points(grade.max_score)} points", ""]
    if grade.error:
        lines += ["**Not graded:**", "", *code_block(grade.error), ""]
    if grade.results:
        lines += [f"Lab `{grade.lab}`; the grader's inputs came from seed {grade.seed}.", ""]
        if grade.kernels:
            lines += [
                f"Triton kernels: {KernelDevice(grade.kernels, grade.cuda_device).describe()} (its kernel's report).",
                "",
            ]
        lines += ["| Exercise | Result | Points | Hints shown |", "|---|---|---|---|"]
        lines += [
            f"| `{result.exercise}` | {result.label} | {_points(result.points)} / {_points(result.max_points)} "
            f"| {result.hints_shown} |"
            for result in grade.results
        ]
        lines += ["", "## Feedback", ""]
        for result in grade.results:
            lines += [f"### `{result.exercise}`: {result.label}", "", *code_block(result.message), ""]
    if grade.notes:
        lines += ["## Notes", "", *code_block("\n".join(grade.notes)), ""]
    return "\n".join(lines)


def write_submission_reports(grade: SubmissionGrade, out_dir: Path) -> list[Path]:
    """Write NAME.json, NAME.xml and NAME.md for one submission; return their paths."""
    grade = grade.as_reported()
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, xml_path, md_path = (out_dir / f"{grade.name}{suffix}" for suffix in (".json", ".xml", ".md"))
    write_json(grade.to_dict(), json_path)
    to_junit(grade).write(xml_path, encoding="utf-8", xml_declaration=True)
    md_path.write_text(to_markdown(grade))
    return [json_path, xml_path, md_path]


def write_grades_csv(grades: Sequence[SubmissionGrade], path: Path, flags: Mapping[str, str] | None = None) -> Path:
    """One row per submission: points per exercise (blank if not part of its lab), total, maximum, error;
    and with `flags` (the similarity report's, by submission), what it flagged for review."""
    exercise_ids = list(dict.fromkeys(result.exercise for grade in grades for result in grade.results))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as file:
        writer = csv.writer(file, quoting=csv.QUOTE_ALL)
        columns = ["submission", "lab", *exercise_ids, "total", "max_total", "error"]
        writer.writerow(columns + (["flags"] if flags is not None else []))
        for grade in map(SubmissionGrade.as_reported, grades):
            points = {result.exercise: _points(result.points) for result in grade.results}
            row = [grade.name, grade.lab or "", *(points.get(i, "") for i in exercise_ids)]
            row += [_points(grade.score), _points(grade.max_score), grade.error or ""]
            row += [report_text(flags.get(grade.name, ""))] if flags is not None else []
            writer.writerow(map(csv_cell, row))
    return path


def grade_from_dict(report: dict[str, Any]) -> SubmissionGrade:
    """The grade a NAME.json report was written from (its inverse: `SubmissionGrade.to_dict`)."""
    results = [
        CheckResult(
            passed=entry["passed"],
            points=entry["points"],
            message=entry["message"],
            exercise=entry["id"],
            status=entry["status"],
            max_points=entry["max_points"],
            hints_shown=entry["hints_shown"],
        )
        for entry in report["exercises"]
    ]
    return SubmissionGrade(
        name=report["submission"],
        path=report["path"],
        lab=report["lab"],
        seed=report["seed"],
        results=results,
        notes=report["notes"],
        error=report["error"],
        elapsed_s=report["elapsed_s"],
        kernels=report.get("kernels"),
        cuda_device=report.get("cuda_device"),
    )


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_json(data: Any, path: Path) -> Path:
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def write_checksums(written: Sequence[Path], out_dir: Path) -> tuple[Path, str]:
    """Write checksums.json with the SHA-256 of each written file; return it and its own digest."""
    checksums = {path.name: sha256_of(path) for path in written}
    manifest = write_json({"algorithm": "sha256", "files": checksums}, out_dir / CHECKSUMS_FILE)
    return manifest, sha256_of(manifest)


def similarity_flags(similarity: ClassSimilarity | None) -> dict[str, str] | None:
    """The `flags` column of grades.csv: None (no column) where no similarity report was made."""
    return similarity.flags() if similarity is not None and similarity.problem is None else None


def write_reports(
    grades: Sequence[SubmissionGrade],
    out_dir: Path,
    run: dict[str, Any] | None = None,
    similarity: ClassSimilarity | None = None,
) -> tuple[Path, str]:
    """Write every report (and `run` as run.json, `similarity` as similarity.html and .json), then
    checksums.json; return it and its own digest."""
    written = [path for grade in grades for path in write_submission_reports(grade, out_dir)]
    out_dir.mkdir(parents=True, exist_ok=True)
    written.append(write_grades_csv(grades, out_dir / "grades.csv", similarity_flags(similarity)))
    if similarity is not None:
        written += write_similarity(similarity, out_dir)
    if run is not None:
        written.append(write_json(run, out_dir / RUN_FILE))
    return write_checksums(written, out_dir)
