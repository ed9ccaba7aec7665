"""Issue 13: the grader holds when the attacker is another submission in the same run.

One `labkit grade` run holds an honest, solved notebook and one attacker per attack
class (tests/fixtures/grading/attacks/), graded together with --jobs 3 as a hostile
class would be. Every test checks the same three things for its attacker: it scores 0,
the honest submission keeps full marks, and nothing the attacker started is still alive.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest
from markdown_it import MarkdownIt

import labkit
from labkit.cli import main
from labkit.grading import sandbox
from labkit.grading.report_text import MAX_TEXT_BYTES
from labkit.grading.submissions import submission_names

FIXTURES = Path(__file__).parent / "fixtures" / "grading"
ATTACKS = FIXTURES / "attacks"
HONEST = FIXTURES / "source" / "demo_basics.ipynb"
LABKIT = Path(labkit.__file__).resolve().parent
GUARDED = [LABKIT / "grading" / "judge.py", LABKIT / "grading" / "exercises" / "demo.py"]
PLANTED = Path(sys.executable).parent / "mimetypes.py"

FAKE_SECRETS = {
    name: f"labkit-fake-secret-{number}"
    for number, name in enumerate(["AWS_ACCESS_KEY_ID", "DATABASE_URL", "GH_PAT", "DEPLOY_SSH_KEY", "NPM_AUTH"])
}
_DEPTH = 100_000
CRAFTED = {  # notebooks crafted to be read wrongly, or to break the reading (issue 30.4)
    "crafted_deep": '{"nbformat": 4, "nbformat_minor": 5, "metadata": {"x": '
    + "[" * _DEPTH
    + "]" * _DEPTH
    + '}, "cells": []}',
    "crafted_metadata": json.dumps(
        {
            "nbformat": 4,
            "nbformat_minor": 5,
            "metadata": {
                "kernelspec": {"name": ["x"], "display_name": 3},
                "language_info": 5,
                "labkit": {"lab": "x\n#"},
            },
            "cells": [
                {"cell_type": "code", "metadata": {"tags": "exercise:"}, "source": "def add(a, b):\n    return a - b"}
            ],
        }
    ),
}

pytestmark = pytest.mark.skipif(
    sandbox.sandbox_problem() is not None, reason=f"no sandbox can be made here: {sandbox.sandbox_problem()}"
)


def marker(name: str) -> str:
    return f"labkit-attack-{name}"


def leave_a_process_behind(name: str) -> str:
    """A first cell for every attacker: a detached process that would outlive its kernel."""
    return (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {marker(name)!r}], "
        "start_new_session=True)\n"
    )


def attacking_notebook(name: str, placeholders: dict[str, str]) -> nbformat.NotebookNode:
    """The notebook for attacks/NAME.py: its `# %%` cells with the placeholders filled in."""
    text = (ATTACKS / f"{name}.py").read_text().replace("__MARKER__", marker(name))
    for key, value in placeholders.items():
        text = text.replace(key, value)
    cells = [leave_a_process_behind(name)] + [cell.strip() for cell in text.split("# %%") if cell.strip()]
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])


def processes_with(text: str) -> list[int]:
    """Host pids whose command line contains `text`."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def attacked_run(tmp_path_factory):
    """Grade the honest notebook with every attacker in one run; return what a test needs to judge it."""
    folder = tmp_path_factory.mktemp("hostile_class")
    out = folder / "grades"
    cache = folder / "cache" / "SmolLM2-135M-Instruct"
    cache.mkdir(parents=True)
    (cache / "model.safetensors").write_bytes(b"weights" * 1000)
    honest = folder / "honest.ipynb"
    shutil.copyfile(HONEST, honest)
    placeholders = {
        "__OUT_DIR__": str(out),
        "__HONEST__": str(honest),
        "__LABKIT__": str(LABKIT),
        "__SANDBOX_ROOT__": str(sandbox.sandboxes_root()),
    }
    attackers = sorted(path.stem for path in ATTACKS.glob("*.py"))
    paths = [honest]
    for name in attackers:
        path = folder / f"{name}.ipynb"
        nbformat.write(attacking_notebook(name, placeholders), path)
        paths.append(path)
    for name, text in CRAFTED.items():
        path = folder / f"{name}.ipynb"
        path.write_text(text)
        paths.append(path)
    before = {path: path.read_bytes() for path in [*GUARDED, honest, cache / "model.safetensors"]}
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setenv("LABKIT_CACHE", str(cache.parent))
        for name, value in FAKE_SECRETS.items():  # as in any CI job
            patch.setenv(name, value)
        code = main(
            ["grade", *map(str, paths), "--out", str(out), "--lab", "demo", "--cell-timeout", "30", "--jobs", "3"]
        )
    time.sleep(1)  # time for a surviving process to do its damage
    changed = [str(path) for path, data in before.items() if path.read_bytes() != data]
    for path, data in before.items():  # put back anything an attack changed, so one failure does not spread
        path.write_bytes(data)
    planted = PLANTED.exists()
    PLANTED.unlink(missing_ok=True)
    names = dict(zip((path.stem for path in paths), submission_names(paths)))
    reports = {stem: json.loads((out / f"{name}.json").read_text()) for stem, name in names.items()}
    yield {
        "code": code,
        "out": out,
        "printed": printed.getvalue(),
        "reports": reports,
        "changed": changed,
        "planted": planted,
    }
    for name in attackers:  # leave no process behind even when a test failed
        for pid in processes_with(marker(name)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def messages(report: dict) -> str:
    return "\n".join(exercise["message"] for exercise in report["exercises"])


def attack_failed(run: dict, name: str) -> dict:
    """The three checks every attack class shares; returns the attacker's report for more."""
    assert run["code"] == 0
    honest, attacker = run["reports"]["honest"], run["reports"][name]
    assert honest["score"] == honest["max_score"] == 4, messages(honest)
    assert attacker["score"] == 0, messages(attacker)
    assert processes_with(marker(name)) == []
    return attacker


def test_reports_cannot_be_rewritten_after_the_run(attacked_run):
    attack_failed(attacked_run, "rewrites_reports")
    out = attacked_run["out"]
    manifest = json.loads((out / "checksums.json").read_text())
    assert set(manifest["files"]) >= {"rewrites_reports.json", "honest.json", "grades.csv"}
    assert all(digest(out / name) == value for name, value in manifest["files"].items())
    assert f"sha256 of checksums.json: {digest(out / 'checksums.json')}" in attacked_run["printed"]


def test_another_submissions_results_cannot_be_handed_in(attacked_run):
    report = attack_failed(attacked_run, "copies_results")
    assert "saw []" in messages(report)  # no other submission's result file was even visible
    seeds = [report["seed"] for report in attacked_run["reports"].values()]
    assert len(set(seeds)) == len(seeds)  # and each submission had inputs of its own


def test_a_classmates_notebook_cannot_be_read_or_spoilt(attacked_run):
    report = attack_failed(attacked_run, "copies_notebook")
    assert "could not read the classmate's notebook" in messages(report)
    assert not any(path.endswith("honest.ipynb") for path in attacked_run["changed"])


def test_no_code_can_be_planted_where_the_grader_imports_from(attacked_run):
    report = attack_failed(attacked_run, "injects_code")
    assert "planted []" in messages(report)
    assert not attacked_run["planted"] and not any("judge.py" in path for path in attacked_run["changed"])


def test_the_reference_cannot_be_poisoned(attacked_run):
    report = attack_failed(attacked_run, "poisons_reference")
    assert "poisoned []" in messages(report)
    assert attacked_run["changed"] == []


def test_result_files_cannot_pin_or_exhaust_the_grader(attacked_run):
    report = attack_failed(attacked_run, "pins_grader")
    by_id = {exercise["id"]: exercise["message"] for exercise in report["exercises"]}
    assert "is a view (expanded" in by_id["demo.add"]
    assert "more than the" in by_id["demo.softmax"] and "bytes its answer needs" in by_id["demo.softmax"]
    assert "not a regular file" in by_id["demo.greedy_tokens"]


def test_a_submission_named_like_a_run_report_cannot_take_its_place(attacked_run):
    attack_failed(attacked_run, "checksums")
    manifest = json.loads((attacked_run["out"] / "checksums.json").read_text())
    assert "checksums.json" not in manifest["files"] and "checksums_submission.json" in manifest["files"]


def test_learner_text_cannot_forge_or_swamp_the_reports(attacked_run):
    attack_failed(attacked_run, "forges_reports")
    out = attacked_run["out"]
    markdown = (out / "forges_reports.md").read_text()
    tokens = MarkdownIt().parse(markdown)
    headings = [inline.content for opening, inline in zip(tokens, tokens[1:]) if opening.type == "heading_open"]
    assert headings[0] == "forges_reports: 0 / 4 points" and "forges_reports: 4 / 4 points" not in headings[1:]
    for suffix in (".json", ".xml", ".md"):  # each message within the bound, not 3 MB
        assert (out / f"forges_reports{suffix}").stat().st_size < 10 * MAX_TEXT_BYTES, suffix
    ET.parse(out / "forges_reports.xml")  # still well-formed XML


def test_crafted_results_still_get_a_verdict_on_every_exercise(attacked_run):
    report = attack_failed(attacked_run, "crafts_results")
    assert report["status"] == "graded"
    assert {exercise["status"] for exercise in report["exercises"]} == {"error"}, messages(report)
    assert len(report["exercises"]) == 3 and all(exercise["message"] for exercise in report["exercises"])


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_a_crafted_notebook_gets_a_report_with_its_status_and_reason(attacked_run, name):
    report = attack_failed(attacked_run, name)
    assert len(report["exercises"]) == 3  # a row per exercise, so the class table lines up
    if name == "crafted_deep":
        assert report["status"] == "not_graded" and "not a readable Jupyter notebook" in report["error"]
        assert {exercise["status"] for exercise in report["exercises"]} == {"not_run"}
    else:  # graded on the lab the run names, whatever its metadata says
        assert report["status"] == "graded" and report["exercises"][0]["status"] == "fail"
    assert "could not be (0 points" in attacked_run["printed"] and "crafted_deep" in attacked_run["printed"]


def test_no_secret_of_the_graders_environment_reaches_a_kernel(attacked_run):
    report = attack_failed(attacked_run, "reads_secrets")
    assert "environment [" in messages(report) and "'PATH'" in messages(report)
    reports = "".join(path.read_text() for path in attacked_run["out"].iterdir())
    assert [name for name, value in FAKE_SECRETS.items() if value in reports] == []


def test_no_process_of_the_run_is_left(attacked_run):
    # Every kernel's command line names its folder under the run's sandbox root.
    assert processes_with(str(sandbox.sandboxes_root())) == []
