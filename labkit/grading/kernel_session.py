"""A kernel that outlives the notebook it runs: per-cell timeouts, a time budget, crash recovery.

nbclient runs each cell; a cell that runs past its timeout is interrupted, and if
the kernel ignores the interrupt it is killed. When the kernel dies (a crash, an
os._exit, a kill), a fresh one is started and the cells that had completed are run
again, skipping the one that killed it, so the rest of the notebook and the
grading still happen. The number of restarts is capped so a notebook that crashes
every kernel cannot keep the grader busy for ever, and one wall-clock deadline covers
the whole session, restarts, setup and replays included.

Nothing the learner's code writes can run before a later kernel's first cell: each
kernel gets a fresh IPython directory of its own (no startup files, no profile config
left by an earlier one), no user site-packages, and no working directory on sys.path
(`PYTHONSAFEPATH`), so a `torch.py` left in the folder shadows nothing.

Given a `launch_prefix` (the sandbox's command), the kernel is started through it and
talks to the grader over Unix sockets in its own folder rather than TCP, so it can
live in a network namespace of its own.
"""

from __future__ import annotations

import math
import os
import subprocess
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import zmq
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionComplete, DeadKernelError

from labkit.grading.report_text import report_text
from labkit.grading.steady_client import SteadyNotebookClient

# Outcome of running one piece of code.
RAN = "ok"
RAISED = "error"
TIMED_OUT = "timeout"
DIED = "crashed"
SKIPPED = "skipped"

_TIMEOUT_MARK = "LabkitCellTimeout"  # the ename nbclient reports for a cell that ran out of time
_PROBE_TIMEOUT_S = 3  # how long an interrupted kernel gets to show it is listening again
# The kernel's messages are the learner's to shape: one larger than this drops the connection rather
# than land in the grader's memory, and at most this many wait unread on a socket.
MAX_MESSAGE_BYTES = 4 << 20
MAX_QUEUED_MESSAGES = 16


@dataclass(frozen=True)
class Outcome:
    """What happened to one piece of code: a status above and a one-line detail."""

    status: str
    detail: str = ""


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel started through a sandbox's command, reached through Unix sockets in `transport`.

    Its connection file is handed to the sandbox's user; interrupts are sent as messages,
    since a signal to the sandbox's outermost process would not reach the kernel.
    """

    def __init__(
        self, folder: Path, transport: Path, launch_prefix: list[str], owner_uid: int | None, **kwargs: Any
    ) -> None:
        super().__init__(
            transport="ipc", ip=str(transport / "kernel"), connection_file=str(folder / "kernel.json"), **kwargs
        )
        self._launch_prefix = launch_prefix
        self._owner_uid = owner_uid
        self.kernel_spec.interrupt_mode = "message"

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        return [*self._launch_prefix, *super().format_kernel_cmd(extra_arguments)]

    def write_connection_file(self, **kwargs: Any) -> None:
        super().write_connection_file(**kwargs)
        if self._owner_uid is not None:
            os.chown(self.connection_file, self._owner_uid, self._owner_uid)


class ReplyOnlyClient(SteadyNotebookClient):
    """A notebook client that keeps none of the kernel's output messages (prints, displays, widgets).

    Only the execute reply matters to the grader, and a kernel that floods its output channel
    would otherwise grow the grader's memory with every message until the cell ends.
    """

    def process_message(self, msg: dict[str, Any], cell: Any, cell_index: int) -> None:
        content = msg.get("content", {})
        if msg.get("msg_type") == "status" and content.get("execution_state") == "idle":
            raise CellExecutionComplete()
        return None


def bounded_manager(km: AsyncKernelManager) -> AsyncKernelManager:
    """The kernel manager, with every socket its clients open bounded in message size and queue length."""
    km.context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    km.context.setsockopt(zmq.RCVHWM, MAX_QUEUED_MESSAGES)
    return km


class KernelSession:
    """Runs a notebook's cells, then the grader's code, in one (restartable) kernel.

    `setup_code` runs first in every fresh kernel, outside the notebook's time
    budget: the grader imports its agent there. Not torch: a kernel imports it only
    where the notebook or an exercise's inputs need it, inside the cell that does.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        cell_timeout: float,
        notebook_budget: float,
        kernel_name: str = "python3",
        env: dict[str, str] | None = None,
        setup_code: str = "",
        setup_timeout: float = 300.0,
        max_restarts: int = 3,
        launch_prefix: list[str] | None = None,
        owner_uid: int | None = None,
        transport: Path | None = None,
        wall_clock_limit: float = math.inf,
    ) -> None:
        self.workdir = workdir
        self.cell_timeout = cell_timeout
        self.kernel_name = kernel_name
        self.env = env
        self.setup_code = setup_code
        self.setup_timeout = setup_timeout
        self.launch_prefix = launch_prefix  # the sandbox's command, or None to start kernels directly
        self.owner_uid = owner_uid  # the sandbox's user, who must be able to read the connection file
        self.transport = transport or workdir  # where a sandboxed kernel's sockets are (see _start)
        self.setup_problem: Outcome | None = None  # set if the setup code failed in the last kernel
        self.restarts = 0
        self._max_restarts = max_restarts
        self._budget_left = notebook_budget
        self.wall_clock_limit = wall_clock_limit  # for everything this session runs, restarts included
        self._deadline = time.monotonic() + wall_clock_limit
        self._replay: list[str] = []  # notebook cells that completed, to re-run in a fresh kernel
        self._client: NotebookClient | None = None
        self._stack = ExitStack()
        self._started = False
        self._reply: dict[str, Any] = {}

    def __enter__(self) -> KernelSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Shut the kernel down (immediately; nothing in it is needed any more)."""
        self._client = None
        try:
            self._stack.close()
        except Exception:  # a kernel that is already gone can fail to clean up; nothing is lost
            pass
        self._stack = ExitStack()

    def _time_left(self) -> float:
        return self._deadline - time.monotonic()

    def _out_of_time(self) -> Outcome | None:
        if self._time_left() > 0:
            return None
        self.close()
        return Outcome(
            SKIPPED, f"not run: the submission's wall-clock limit ({self.wall_clock_limit:.0f} s) was used up"
        )

    def run_notebook_cell(self, source: str) -> Outcome:
        """Run one of the notebook's cells under the per-cell timeout and the notebook's time budget."""
        if stopped := self._out_of_time():
            return stopped
        if not self._ensure_kernel():
            return self._out_of_time() or Outcome(SKIPPED, "not run: the kernel crashed too many times")
        outcome = self._run_budgeted(source)
        if outcome.status in (RAN, RAISED):
            self._replay.append(source)
        return outcome

    def run_grader_code(self, source: str) -> Outcome:
        """Run the grader's own code in the notebook's namespace, under the per-cell timeout only."""
        if stopped := self._out_of_time():
            return stopped
        if not self._ensure_kernel():
            return self._out_of_time() or Outcome(SKIPPED, "not run: the kernel crashed too many times")
        return self._execute(source, self.cell_timeout)

    def _run_budgeted(self, source: str) -> Outcome:
        if self._budget_left <= 0:
            return Outcome(SKIPPED, "not run: the notebook's total time limit was used up")
        started = time.monotonic()
        outcome = self._execute(source, min(self.cell_timeout, self._budget_left))
        self._budget_left -= time.monotonic() - started
        return outcome

    def _ensure_kernel(self) -> bool:
        while self._client is None:
            if self._time_left() <= 0:
                return False
            if self._started:
                if self.restarts >= self._max_restarts:
                    return False
                self.restarts += 1
            self._start()
            if self.setup_code:
                outcome = self._execute(self.setup_code, self.setup_timeout)
                self.setup_problem = outcome if outcome.status != RAN else None
            self._replay_completed_cells()
        return True

    def _start(self) -> None:
        self._started = True
        if self.launch_prefix is not None:
            km = SandboxedKernelManager(
                self.workdir, self.transport, self.launch_prefix, self.owner_uid, kernel_name=self.kernel_name
            )
            self._hand_transport_to(self.owner_uid)  # the new kernel makes its sockets there
        else:
            km = AsyncKernelManager(kernel_name=self.kernel_name)
        env = dict(os.environ if self.env is None else self.env)
        env.update(PYTHONSAFEPATH="1", PYTHONNOUSERSITE="1", IPYTHONDIR=self._fresh_ipython_dir())
        client = ReplyOnlyClient(
            nbformat.v4.new_notebook(),
            km=bounded_manager(km),
            kernel_name=self.kernel_name,
            allow_errors=True,
            interrupt_on_timeout=True,
            error_on_timeout={"ename": _TIMEOUT_MARK, "evalue": ""},
            iopub_timeout=1,  # only the reply matters, not late outputs
            shutdown_kernel="immediate",
            record_timing=False,
            startup_timeout=max(1, math.ceil(min(60.0, self._time_left()))),
        )
        client.on_cell_executed = self._remember_reply
        options: dict[str, Any] = {
            "cwd": str(self.workdir),
            "stdout": subprocess.DEVNULL,
            "stderr": subprocess.DEVNULL,
            "cleanup_kc": True,  # shut the kernel down on exit, also one that a SandboxedKernelManager started
            "env": env,
        }
        self._stack.enter_context(client.setup_kernel(**options))
        if self.launch_prefix is not None:
            self._hand_transport_to(os.geteuid())  # its sockets are made: from now on it cannot swap them
        self._client = client

    def _hand_transport_to(self, uid: int | None) -> None:
        """Give the socket folder to `uid`: the kernel's user while it starts, the grader's once it listens.

        A kernel that could rename its sockets could put a symlink to any socket of the host in their
        place, and the grader would connect there when it reconnects. The folder is outside the
        kernel's own, so it cannot move the folder either. (Only a root grader switches users; an
        unprivileged one shares its user with the kernel, and this does nothing.)
        """
        if uid is not None and self.owner_uid is not None and self.transport != self.workdir:
            os.chown(self.transport, uid, uid)
            os.chmod(self.transport, 0o755)

    def _fresh_ipython_dir(self) -> str:
        """An IPython directory no earlier kernel of this session could write to: in a sandbox, its own
        /tmp (a new one for every kernel); otherwise a new folder of the grader's, removed with the kernel."""
        if self.launch_prefix is not None:
            return "/tmp/labkit-ipython"
        return self._stack.enter_context(tempfile.TemporaryDirectory(prefix="labkit-ipython-"))

    def _replay_completed_cells(self) -> None:
        kept: list[str] = []
        for position, source in enumerate(self._replay):
            if self._client is None:  # it died again: keep the rest for the next fresh kernel
                kept.extend(self._replay[position:])
                break
            if self._run_budgeted(source).status in (RAN, RAISED):
                kept.append(source)
        self._replay = kept

    def _remember_reply(self, cell: Any, cell_index: int, execute_reply: dict[str, Any]) -> None:
        self._reply = execute_reply.get("content", {})

    def _send(self, source: str, seconds: int) -> dict[str, Any]:
        """Execute code and return the kernel's reply; raises DeadKernelError if the kernel dies."""
        assert self._client is not None
        notebook = self._client.nb
        cell = nbformat.v4.new_code_cell(source)
        notebook.cells.append(cell)
        self._client.timeout = seconds
        self._reply = {}
        try:
            self._client.execute_cell(cell, len(notebook.cells) - 1)
        finally:
            cell.outputs = []  # only the reply matters; do not hoard what the code printed
        return self._reply

    def _execute(self, source: str, timeout: float) -> Outcome:
        seconds = max(1, math.ceil(min(timeout, self._time_left())))
        try:
            reply = self._send(source, seconds)
            if reply.get("ename") == _TIMEOUT_MARK:
                probe = self._send("pass", _PROBE_TIMEOUT_S)
                if probe.get("ename") == _TIMEOUT_MARK:  # the interrupt was ignored
                    self.close()
                    return Outcome(
                        TIMED_OUT,
                        f"still running after {seconds} s; it ignored the interrupt, so the kernel was stopped",
                    )
                return Outcome(TIMED_OUT, f"still running after {seconds} s; interrupted")
        except DeadKernelError:
            self.close()
            return Outcome(DIED, "the kernel died while running this code (a crash, exit or kill)")
        if reply.get("status") == "error":
            error = f"{reply.get('ename', 'Error')}: {reply.get('evalue', '')}".rstrip(": ")
            return Outcome(RAISED, report_text(error))  # the learner's text, kept bounded from here on
        return Outcome(RAN)
