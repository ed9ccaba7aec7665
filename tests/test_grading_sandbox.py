"""Issue 13: the grader holds when the attacker is another submission in the same run.

One `labkit grade` run holds an honest, solved notebook and one attacker per attack
class (tests/fixtures/grading/attacks/), graded together with --jobs 3 as a hostile
class would be. Every test checks the same three things for its attacker: it scores 0,
the honest submission keeps full marks, and nothing the attacker started is still alive.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest
from hostile_text import FORGED_FILE_NAME, raw_learner_text
from markdown_it import MarkdownIt

import labkit
from labkit.cli import main
from labkit.grading import grader_only, sandbox
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
DEMO_IDS = ("demo.add", "demo.softmax", "demo.greedy_tokens")
RESERVED = ("GRADES", "run", "Checksums.JSON")  # the other files a run writes, in other cases
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
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    for cell in notebook.cells:  # a cell whose first line is `# tags: exercise:demo.add` is that exercise's cell
        first = cell.source.splitlines()[0]
        if first.startswith("# tags: "):
            cell.metadata["tags"] = first.removeprefix("# tags: ").split()
    return notebook


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


class Listener:
    """A server of the host that no submission should reach: it counts the connections it accepts."""

    def __init__(self, family: int, address) -> None:
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.bind(address)
        self.socket.listen(64)
        self.socket.settimeout(0.2)
        self.connections = 0
        self._running = True
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while self._running:
            try:
                connection, _ = self.socket.accept()
            except OSError:  # the timeout, or closed
                continue
            self.connections += 1
            connection.close()

    def close(self) -> None:
        self._running = False
        self._thread.join()
        self.socket.close()


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
    host_socket = Listener(socket.AF_UNIX, str(folder / "host.sock"))
    host_port = Listener(socket.AF_INET, ("127.0.0.1", 0))
    placeholders = {
        "__HOST_SOCKET__": str(folder / "host.sock"),
        "__HOST_PORT__": str(host_port.socket.getsockname()[1]),
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
    for stem in RESERVED:  # the checksums attack again, under each name of the grader's own files
        path = folder / f"{stem}.ipynb"
        nbformat.write(attacking_notebook("checksums", placeholders), path)
        paths.append(path)
    for name, text in CRAFTED.items():
        path = folder / f"{name}.ipynb"
        path.write_text(text)
        paths.append(path)
    paths.append(folder / FORGED_FILE_NAME)  # a name that would print a forged score line (issue 55.4)
    paths[-1].write_text("not a notebook")
    before = {path: path.read_bytes() for path in [*GUARDED, honest, cache / "model.safetensors"]}
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setenv("LABKIT_CACHE", str(cache.parent))
        for name, value in FAKE_SECRETS.items():  # as in any CI job
            patch.setenv(name, value)
        code = main(
            ["grade", *map(str, paths), "--out", str(out), "--lab", "demo", "--cell-timeout", "30", "--jobs", "3"]
            + ["--hint-penalty", "0.5"]
        )
    time.sleep(1)  # time for a surviving process to do its damage
    left_on_disk = sorted(path.name for path in sandbox.sandboxes_root().iterdir())
    host_socket.close()
    host_port.close()
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
        "left_on_disk": left_on_disk,
        "host_connections": {"unix socket": host_socket.connections, "tcp port": host_port.connections},
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


@pytest.mark.parametrize("stem", RESERVED)
def test_a_submission_named_like_any_file_the_grader_writes_gets_its_own_report(attacked_run, stem):
    """Issue 51.2: renamed, and the rename said in its report and in the class summary."""
    report = attack_failed(attacked_run, stem)
    assert report["submission"] != stem and report["status"] == "graded" and len(report["exercises"]) == 3
    assert f"handed in as '{stem}.ipynb'; its reports are named {report['submission']}" in report["notes"][0]
    assert f"'{stem}.ipynb' as {report['submission']}" in attacked_run["printed"]
    for suffix in (".json", ".xml", ".md"):
        assert (attacked_run["out"] / f"{report['submission']}{suffix}").is_file()
    run = json.loads((attacked_run["out"] / "run.json").read_text())
    assert report["submission"] in run["graded"]


def test_hint_counts_are_said_to_be_self_reported_when_they_cost_points(attacked_run):
    """Issue 51.4: no grader can count what the learner's kernel hid, so every report and the summary say whose word they are."""
    attack_failed(attacked_run, "hides_hints")
    for report in attacked_run["reports"].values():
        assert any("the hint counts are self-reported" in note for note in report["notes"]), report["submission"]
    assert "--hint-penalty 0.5: the hint counts are self-reported" in attacked_run["printed"]
    markdown = (attacked_run["out"] / "honest.md").read_text()
    assert "## Notes" in markdown and "the hint counts are self-reported" in markdown


def test_a_submission_that_calls_labkits_answers_scores_nothing_for_them(attacked_run):
    """Issue 51.3, then 55.1: the demo's answers are the grader's, so in the sandbox they are not even importable
    (outside it, and in the notebook's own check, each fails while its exercise is checked: test_grading_answers)."""
    report = attack_failed(attacked_run, "calls_reference")
    assert {exercise["status"] for exercise in report["exercises"]} == {"missing"}, messages(report)
    assert any("cannot import name 'course_add'" in note for note in report["notes"]), report["notes"]


def test_the_checks_oracle_is_not_in_the_kernel(attacked_run):
    """Issue 55.1: `get_exercise(id).oracle` on the learner function's own inputs: no check is registered there."""
    report = attack_failed(attacked_run, "reads_oracle")
    assert all("unknown exercise" in exercise["message"] for exercise in report["exercises"]), messages(report)


def test_the_seed_is_in_no_frame_and_no_object_of_the_kernel(attacked_run):
    """Issue 55.1: a frame walk and gc find no seed and no Exercise while the learner's function runs."""
    report = attack_failed(attacked_run, "reads_seed")
    assert messages(report).count("no seed and no oracle in the kernel: found 0") == 3, messages(report)


def test_the_checks_modules_cannot_be_imported_reloaded_or_read(attacked_run):
    """Issue 55.1: lab 1's course_causal_mask, lab 12's simulator, the demo's answers; reload, a load from the
    file under another name, the code object in the .pyc: every grader-only module is a stub in the sandbox."""
    report = attack_failed(attacked_run, "imports_checks")
    text = messages(report)
    for name in ("course_causal_mask", "simulate", "course_greedy_tokens"):
        assert name in text, text
    report = attack_failed(attacked_run, "reloads_checks")
    assert {exercise["status"] for exercise in report["exercises"]} == {"error"}, messages(report)
    text = messages(report)
    assert "course_add" in text and "course_softmax" in text and "course_greedy_tokens" in text, text


def test_answer_blocking_switched_off_is_flagged_for_review(attacked_run):
    """What no runtime check prevents is found: the scan of the notebook's cells names the reach into grading."""
    with (attacked_run["out"] / "grades.csv").open(newline="") as file:
        rows = {row["submission"]: row for row in csv.DictReader(file)}
    assert "labkit.grading" in rows["switches_answers"]["flags"], rows["switches_answers"]
    assert rows["honest"]["flags"] == "", rows["honest"]


def test_learner_text_cannot_forge_or_swamp_the_reports(attacked_run):
    attack_failed(attacked_run, "forges_reports")
    out = attacked_run["out"]
    markdown = (out / "forges_reports.md").read_text()
    tokens = MarkdownIt().parse(markdown)
    headings = [inline.content for opening, inline in zip(tokens, tokens[1:]) if opening.type == "heading_open"]
    assert headings[0] == "forges_reports: 0 / 4 points" and "forges_reports: 4 / 4 points" not in headings[1:]
    # Issue 51.1: nor for a reader going line by line: the only lines that start like a heading are the report's own.
    own = ["# forges_reports: 0 / 4 points", "## Feedback", *(f"### `{i}`: ERROR" for i in DEMO_IDS), "## Notes"]
    assert [line for line in markdown.splitlines() if re.match(" {0,3}#", line)] == own
    for suffix in (".json", ".xml", ".md"):  # each message within the bound, not 3 MB
        assert (out / f"forges_reports{suffix}").stat().st_size < 10 * MAX_TEXT_BYTES, suffix
    ET.parse(out / "forges_reports.xml")  # still well-formed XML
    # Issue 55.4: nothing the learners control reaches any file of the run, or its console, raw.
    assert raw_learner_text(attacked_run["printed"]) == [], attacked_run["printed"]
    for path in out.iterdir():
        assert raw_learner_text(path.read_text()) == [], path
        assert not [line for line in path.read_text().splitlines() if line.startswith("# forges_reports: 4")], path


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


def test_a_hint_file_turned_into_a_fifo_stops_nobodys_grading(attacked_run):
    """Issue 30.1: the run ends, and every submission, this one included, has its report."""
    attack_failed(attacked_run, "traps_hint_file")
    assert attacked_run["code"] == 0


def test_a_kernel_cannot_point_the_grader_at_a_socket_of_the_host(attacked_run):
    """Issue 30.2: its sockets' folder is the grader's once the kernel listens, and not inside its own folder."""
    report = attack_failed(attacked_run, "swaps_socket")
    text = messages(report)
    assert "socket swaps:" in text and "swapped" not in text and "folder moved" not in text, text
    assert attacked_run["host_connections"]["unix socket"] == 0


def test_a_flood_of_output_messages_is_not_kept(attacked_run):
    """Issue 30.3: the grader keeps none of a kernel's output, and drops a message over its size limit."""
    report = attack_failed(attacked_run, "floods_transport")
    assert "no answer: the attack is on the transport" in messages(report)


def test_folders_nested_too_deep_for_rmtree_leave_nothing_on_disk(attacked_run):
    """Issue 34.4: every submission's folder is gone when the run ends, whatever its depth."""
    attack_failed(attacked_run, "nests_folders")
    assert attacked_run["left_on_disk"] == []


def test_code_planted_for_a_restarted_kernel_never_runs(attacked_run):
    """Issue 34.2: a startup file, a user-site hook and a shadowing module left for the next kernel do nothing."""
    report = attack_failed(attacked_run, "plants_startup")
    assert "planted code ran: never" in messages(report), messages(report)
    assert any("restarted 1 time" in note for note in report["notes"]), report["notes"]
    assert report["elapsed_s"] < 120  # the planted code sleeps 120 s wherever it runs


def test_process_thread_and_tmpfs_bombs_are_held_to_the_limits(attacked_run):
    """Issue 34.3: at most max_tasks processes and threads together, and a /tmp of tmp_bytes."""
    report = attack_failed(attacked_run, "bombs")
    found = re.search(r"processes (\d+) threads (\d+) tmp (\d+)", messages(report))
    assert found, messages(report)
    processes, threads, written = map(int, found.groups())
    limits = sandbox.Limits(memory_bytes=None, cpu_seconds=1)
    assert processes + threads <= limits.max_tasks and written <= limits.tmp_bytes


def test_no_port_of_the_host_is_reachable_from_a_submission(attacked_run):
    """Issue 34.7: every submission, a lab 9 server included, has a loopback of its own."""
    report = attack_failed(attacked_run, "scans_ports")
    assert "open ports not its own: []; the host's: False" in messages(report), messages(report)
    assert attacked_run["host_connections"]["tcp port"] == 0


def test_a_sandboxed_process_sees_every_grader_only_module_as_a_stub():
    """Issue 55.1, directly: each grader-only file reads as the stub, its __pycache__ is empty, its package still
    imports (so the visible modules beside it do), and no check is registered there."""
    files = [str(path) for path in grader_only.source_files()]
    folders = [str(path) for path in grader_only.pycache_folders() if path.is_dir()]
    script = (
        "import json, os, sys\n"
        "files, folders = json.loads(sys.argv[1]), json.loads(sys.argv[2])\n"
        f"print(sorted(path for path in files if open(path).read() != {grader_only.STUB!r}))\n"
        "print(sorted(path for path in folders if os.listdir(path)))\n"
        "import labkit.labs.lab1, labkit.grading.exercises.demo as demo\n"
        "print(labkit.labs.lab1.__labkit_hidden__, hasattr(demo, 'course_add'))\n"
    )
    with sandbox.sandbox_folder(sandbox.sandbox_uid(0)) as folder:
        command = sandbox.sandbox_command(folder, sandbox.sandbox_uid(0), sandbox.Limits(None, 60))
        done = subprocess.run(
            [*command, sys.executable, "-c", script, json.dumps(files), json.dumps(folders)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["[]", "[]", "True False"]
    assert len(files) == len(grader_only.GRADER_ONLY) and folders  # and there was something to hide
