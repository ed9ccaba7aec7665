"""Lab 2 in a real JupyterLab, in a real browser, clicked through the way a learner does.

Why: nbclient proves the notebooks execute; only a browser proves what a learner sees: Run All
from the menu, every check's verdict rendered, a figure drawn, sliders that answer, and in the
handed-out notebook check cells that cannot be typed into or deleted beside exercise cells that
can. JupyterLab serves copies of the notebooks from a temporary folder, never the repository's.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from browser_helpers import chromium_browser, missing_browser, new_tab, screenshot  # noqa: F401  (the `browser` fixture)

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
LAB = "lab2_kv_cache.ipynb"  # the cheapest lab with an ipywidgets control: the capacity sliders
START_TIMEOUT_S = 120
KERNEL_TIMEOUT_MS = 180_000
UNLOCKED = ("editable", "deletable")  # the negative test's copy: its first check cell editable, its second deletable
RUN_ALL_TIMEOUT_MS = 600_000  # lab 2 runs in about a minute on a busy 2-core CPU
# JupyterLab settings for a test: every cell in the page (no windowing), no news or update pop-ups.
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": '{"windowingMode": "none"}',
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": '{"fetchNews": "false", "checkForUpdates": false}',
}


@dataclass
class Lab:
    """A running JupyterLab and the notebooks it serves."""

    folder: Path
    port: int
    token: str

    def url(self, notebook: str) -> str:
        """The notebook opened alone (`reset` forgets the tabs an earlier test left open)."""
        return f"http://127.0.0.1:{self.port}/lab/tree/{notebook}?reset&token={self.token}"

    def code_cells(self, notebook: str, through: int | None = None) -> int:
        """How many code cells a served notebook has (up to and including cell `through`)."""
        cells = nbformat.read(self.folder / notebook, as_version=4).cells
        return sum(cell.cell_type == "code" for cell in cells[: None if through is None else through + 1])

    def cells(self, notebook: str, kind: str) -> dict[int, str]:
        """Index -> exercise id of the cells tagged `kind:` ("check" or "exercise") in a served notebook."""
        cells = nbformat.read(self.folder / notebook, as_version=4).cells
        return {
            index: tag.removeprefix(f"{kind}:")
            for index, cell in enumerate(cells)
            for tag in cell.metadata.get("tags", [])
            if tag.startswith(f"{kind}:")
        }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def is_check(cell) -> bool:
    return any(tag.startswith("check:") for tag in cell.metadata.get("tags", []))


# The solved copy leaves out lab 2's timing race (nbclient runs it in test_labs_execute.py): a cell that prints
# numbers after 20 s of decoding, which shows a browser nothing that the other cells do not.
RACE = "def generate_without_cache(model, prompt_ids, max_new_tokens):\n    # Lab 1's loop"


def clean_copy(source: Path, target: Path, unlock: tuple[str, ...] = (), leave_out: str = "") -> None:
    """Copy a notebook without outputs (a stored PASS must not stand in for a run); set `unlock[i]` (editable or
    deletable) true on its i-th check cell; `leave_out` the code cell that starts with it."""
    notebook = nbformat.read(source, as_version=4)
    if leave_out:
        kept = [cell for cell in notebook.cells if not cell.source.startswith(leave_out)]
        assert len(kept) == len(notebook.cells) - 1, f"{source.name} has no cell starting {leave_out!r}"
        notebook.cells = kept
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    for cell, key in zip((cell for cell in notebook.cells if is_check(cell)), unlock):
        cell.metadata[key] = True
    nbformat.write(notebook, target)


def serve_copies(folder: Path) -> None:
    """Solved and learner lab 2, and a learner copy whose first check cell is editable and second deletable (the
    negative tests)."""
    clean_copy(REPO / "labs" / "source" / LAB, folder / "solved.ipynb", leave_out=RACE)
    clean_copy(REPO / "labs" / LAB, folder / "learner.ipynb")
    clean_copy(REPO / "labs" / LAB, folder / "unlocked.ipynb", unlock=UNLOCKED)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """`jupyter lab` on 127.0.0.1 with a random port and token, its own settings; stopped whatever happens."""
    if reason := missing_browser():
        pytest.skip(reason)
    folder, home = tmp_path_factory.mktemp("labs"), tmp_path_factory.mktemp("jupyter")
    serve_copies(folder)
    for name, text in SETTINGS.items():
        (home / "settings" / name).parent.mkdir(parents=True, exist_ok=True)
        (home / "settings" / name).write_text(text)
    lab = Lab(folder, free_port(), secrets.token_hex(16))
    command = [
        str(Path(sys.executable).with_name("jupyter")),
        "lab",
        "--no-browser",
        "--allow-root",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={lab.port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={lab.token}",
        f"--ServerApp.root_dir={folder}",
        f"--LabApp.user_settings_dir={home / 'settings'}",
        f"--LabApp.workspaces_dir={home / 'workspaces'}",
    ]
    # Kernels import this checkout's labkit; the user's own Jupyter configuration stays out of the test.
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    log = home / "jupyterlab.log"
    with log.open("w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_until_serving(server, lab, log)
        yield lab
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the kernels it started
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def wait_until_serving(server: subprocess.Popen, lab: Lab, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert server.poll() is None, f"jupyter lab exited ({server.returncode}):\n{log.read_text()[-3000:]}"
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{lab.port}/api/status?token={lab.token}", timeout=5)
            return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"jupyter lab did not answer within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


# --- what a learner does in the browser ----------------------------------------------------------


def open_notebook(browser, url: str):
    """A tab showing the notebook once its kernel has started: the status bar reads "Python 3 (ipykernel) | Idle".

    (Before the kernel starts the bar reads "No Kernel | Initializing", and a Run then asks which kernel to start.)
    """
    tab = new_tab(browser, viewport={"width": 1400, "height": 1000})
    tab.goto(url)
    kernel_idle = re.compile(r"^(?!No Kernel).+ \| Idle$")
    tab.locator(".jp-StatusBar-TextItem", has_text=kernel_idle).wait_for(timeout=KERNEL_TIMEOUT_MS)
    return tab


def cells(tab):
    return tab.locator(".jp-Notebook .jp-Cell")


def run_from_menu(tab, item: str) -> None:
    tab.get_by_role("menuitem", name="Run", exact=True).click()
    tab.get_by_role("menuitem", name=item, exact=True).click()


def prompts(tab) -> list[str]:
    """The code cells' prompts: "[ ]:" never run, "[*]:" queued or running, "[7]:" ran."""
    return tab.locator(".jp-Notebook .jp-CodeCell .jp-InputArea-prompt").all_inner_texts()


# A run has finished (or stopped at an error) when some cell ran, none is queued and the kernel is idle.
RUN_FINISHED_JS = """() => {
    const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt')].map(p => p.textContent);
    const status = document.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status;
    return prompts.some(p => /\\d/.test(p)) && !prompts.some(p => p.includes('*')) && status === 'idle';
}"""


def assert_first_cells_ran(tab, count: int) -> None:
    """Wait for the run to finish, then check the first `count` code cells ran; else show where it stopped."""
    tab.wait_for_function(RUN_FINISHED_JS, timeout=RUN_ALL_TIMEOUT_MS)
    ran = [bool(re.search(r"\d", prompt)) for prompt in prompts(tab)]
    if not all(ran[:count]):
        last = max((i for i, done in enumerate(ran) if done), default=0)
        stopped = tab.locator(".jp-Notebook .jp-CodeCell").nth(last)
        screenshot(tab, "lab2-run-stopped")
        pytest.fail(f"the run stopped after code cell {last}:\n{source(stopped)}\n---\n{output(stopped)}")


def source(cell) -> str:
    return cell.locator(".cm-content").inner_text()


def output(cell) -> str:
    return "\n".join(cell.locator(".jp-OutputArea-output").all_inner_texts())


def type_into(tab, cell, text: str) -> None:
    """Click into the cell's editor and type, as a learner would; then leave the editor."""
    cell.locator(".cm-content").click()
    tab.keyboard.press("Control+End")
    tab.keyboard.type(text)
    tab.keyboard.press("Escape")


def assert_locked(tab, index: int) -> None:
    """Typing into cell `index` changes nothing, and deleting it (D, D in command mode) leaves it in place."""
    cell, count = cells(tab).nth(index), cells(tab).count()
    before = source(cell)
    type_into(tab, cell, "x = 1  # ")
    assert source(cell) == before, f"cell {index} is editable: typing turned {before!r} into {source(cell)!r}"
    cell.locator(".jp-InputPrompt").click()  # select the cell, in command mode
    tab.keyboard.press("d")
    tab.keyboard.press("d")
    assert cells(tab).count() == count and source(cells(tab).nth(index)) == before, f"cell {index} could be deleted"


# --- the tests -----------------------------------------------------------------------------------


def test_solved_lab_runs_from_the_menu_every_check_passes_and_the_sliders_answer(lab: Lab, browser) -> None:
    tab = open_notebook(browser, lab.url("solved.ipynb"))
    run_from_menu(tab, "Run All Cells")
    assert_first_cells_ran(tab, lab.code_cells("solved.ipynb"))
    screenshot(tab, "lab2-solved-run-all")
    checks = lab.cells("solved.ipynb", "check")
    assert len(checks) == 4, checks
    for index, exercise in checks.items():
        verdict = output(cells(tab).nth(index))
        assert verdict.startswith(f"PASS {exercise}"), f"check cell {index} shows:\n{verdict}"

    figures = tab.evaluate("() => [...document.querySelectorAll('.jp-OutputArea-output img')].map(i => i.naturalWidth)")
    assert figures and all(figures), f"figures in the outputs and their widths: {figures}"

    from playwright.sync_api import expect

    slider = tab.locator(".widget-slider", has=tab.locator(".widget-label", has_text="context"))
    redrawn = tab.locator(".jp-OutputArea-output", has=slider).locator(".widget-output")  # what the kernel draws
    before = redrawn.inner_text()
    slider.locator(".noUi-handle").press("ArrowLeft")  # one step shorter a context
    expect(redrawn, "moving the slider did not redraw the capacity").not_to_have_text(before)
    screenshot(tab, "lab2-solved-slider-moved")
    tab.close()


def test_learner_lab_locks_checks_opens_exercises_and_a_check_says_not_done(lab: Lab, browser) -> None:
    tab = open_notebook(browser, lab.url("learner.ipynb"))
    checks, exercises = lab.cells("learner.ipynb", "check"), lab.cells("learner.ipynb", "exercise")
    assert len(checks) == 4 and len(exercises) == 4, (checks, exercises)
    for index in checks:
        assert_locked(tab, index)

    first_check = min(checks)
    cells(tab).nth(first_check).locator(".jp-InputPrompt").click()
    run_from_menu(tab, "Run All Above Selected Cell")
    cells(tab).nth(first_check).locator(".jp-InputPrompt").click()
    tab.keyboard.press("Shift+Enter")  # then the check itself
    assert_first_cells_ran(tab, lab.code_cells("learner.ipynb", through=first_check))
    verdict = output(cells(tab).nth(first_check))
    assert verdict.startswith(f"NOT DONE {checks[first_check]}"), f"the check before its exercise shows:\n{verdict}"
    assert "NotImplementedError" in verdict, f"the verdict does not say what to do next:\n{verdict}"

    exercise = cells(tab).nth(min(exercises))
    before = source(exercise)
    type_into(tab, exercise, "# my attempt ")
    assert source(exercise) != before, "the exercise cell could not be typed into"
    screenshot(tab, "lab2-learner-not-done")
    tab.close()


def test_the_lock_assertion_fails_on_a_check_cell_left_unlocked(lab: Lab, browser) -> None:
    """The negative cases, in one notebook: assert_locked fails on the check cell left `editable` and on the one left
    `deletable`, each for its own reason."""
    tab = open_notebook(browser, lab.url("unlocked.ipynb"))
    checks = sorted(lab.cells("unlocked.ipynb", "check"))
    for index, unlocked in zip(checks, UNLOCKED):
        with pytest.raises(AssertionError, match="editable" if unlocked == "editable" else "could be deleted"):
            assert_locked(tab, index)
    tab.close()
