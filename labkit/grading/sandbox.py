"""A bubblewrap sandbox per submission: its own user, processes, network and scratch folder.

Every submission's kernel is started through `sandbox_command`: bubblewrap (`bwrap`,
a well-kept Debian package) gives it new PID, network, IPC and UTS namespaces, a
filesystem in which only the Python installation, the virtual environment, labkit
and the model cache are visible (read-only), a private /tmp, and one writable
folder of its own. When the grader runs as root the kernel also drops to a user id
of its own (`setpriv`), so it owns nothing outside that folder and no two
submissions share a user; otherwise bubblewrap's user namespace plays that part.
`prlimit` caps its address space and CPU time. Nothing of another submission, of
the grader's command line or of its output folder is in view. With a card of its own
(`labkit grade --gpu`, gpu_access.py) it also sees that card's device nodes and the
driver's files, and its cgroup's memory limit alone bounds its memory: CUDA cannot start
under an address-space limit.

Kill the sandbox's outermost process and bubblewrap's `--die-with-parent` takes
down its init, whose exit kills everything left in the PID namespace: a process
that daemonised still dies with its kernel. `kill_processes_of` then checks, by
user id, that nothing of the submission is left.
"""

from __future__ import annotations

import atexit
import functools
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import labkit
from labkit.cache import cache_root
from labkit.grading import cgroups, grader_only

_UID_BLOCKS = (1 << 30, 1 << 31, 1 << 12)  # user ids a run draws its block from: first, end, block size
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_PROBE_TIMEOUT_S = 20


@dataclass(frozen=True)
class Limits:
    """Per-kernel resource limits, applied with prlimit to everything in the sandbox."""

    memory_bytes: int | None  # address space (RLIMIT_AS), and the cgroup's memory where there is one; None: unlimited
    cpu_seconds: int  # CPU time of each process (RLIMIT_CPU): a backstop behind the wall-clock timeouts
    max_tasks: int = 512  # processes and threads (RLIMIT_NPROC of its own user, and the cgroup's pids.max)
    tmp_bytes: int = 1 << 30  # the size of its private /tmp, a tmpfs: host memory otherwise no limit counts


def switches_user() -> bool:
    """Whether sandboxes run as users of their own (the grader is root), rather than in a user namespace."""
    return os.geteuid() == 0


def read_only_paths() -> list[Path]:
    """What a kernel needs to see: the Python installation, the environment, labkit, the model cache."""
    candidates = [Path(sys.base_prefix), Path(sys.prefix), Path(labkit.__file__).parent, cache_root()]
    paths: list[Path] = []
    for path in sorted({candidate.resolve() for candidate in candidates if candidate.exists()}):
        if not any(path.is_relative_to(kept) for kept in paths):  # already visible through a folder above it
            paths.append(path)
    return paths


def shown_read_only() -> list[Path]:
    """Every folder a sandbox shows read-only: the system's own, then `read_only_paths()`."""
    return [Path("/usr"), Path("/etc"), *map(Path, _SYSTEM_DIRS), *read_only_paths()]


def _system_arguments(tmp_bytes: int) -> list[str]:
    arguments = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for folder in _SYSTEM_DIRS:
        if os.path.islink(folder):
            arguments += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            arguments += ["--ro-bind", folder, folder]
    return arguments + [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--size",
        str(tmp_bytes),
        "--tmpfs",
        "/tmp",
    ]


def _bind_arguments(binds: list[tuple[str, Path]]) -> list[str]:
    """bwrap arguments that bind each path at the same place, creating its parents world-readable.

    (bwrap would create missing parents as 0700 root folders, which an unprivileged kernel cannot enter.)
    """
    arguments: list[str] = []
    made = {Path("/"), Path("/tmp"), Path("/usr"), Path("/etc"), Path("/dev")}
    for kind, path in binds:
        for parent in reversed(path.parents):
            if parent not in made:
                arguments += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        arguments += [kind, str(path), str(path)]
        made.add(path)
    return arguments


def sandbox_command(
    folder: Path,
    uid: int,
    limits: Limits,
    cgroup_procs: Sequence[Path] = (),
    transport: Path | None = None,
    gpu_binds: Sequence[tuple[str, Path]] = (),
) -> list[str]:
    """The command prefix that runs a program in a fresh sandbox whose only writable place is `folder`
    (and `transport`, the folder of its sockets, while the grader lets it), inside the cgroups whose
    `cgroup.procs` files are given, if any. `gpu_binds` (gpu_access.sandbox_binds) give it a card:
    then no address-space limit is set, and the cgroups' memory limit must bound it."""
    limit_arguments = [f"--cpu={limits.cpu_seconds}"]
    if limits.memory_bytes and not gpu_binds:  # CUDA reserves far more address space than it uses
        limit_arguments.append(f"--as={limits.memory_bytes}")
    if switches_user():  # the count is per user: only a user of its own makes it the submission's
        limit_arguments.append(f"--nproc={limits.max_tasks}")
    if switches_user():  # namespaces without a user namespace, then a user of its own inside
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        drop += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    else:  # an unprivileged grader: bubblewrap's user namespace is the kernel's own user
        namespaces, drop = ["--unshare-all"], []
    binds = [("--ro-bind", path) for path in read_only_paths()] + [("--bind", folder.resolve())]
    if transport is not None:
        binds.append(("--bind", transport.resolve()))
    binds += gpu_binds
    binds_and_hiding = [*_bind_arguments(binds), *_hiding_arguments()]
    return [
        *cgroups.join_command(list(cgroup_procs)),
        "prlimit",
        *limit_arguments,
        "--",
        "bwrap",
        *namespaces,
        "--die-with-parent",
        "--new-session",
        *_system_arguments(limits.tmp_bytes),
        *binds_and_hiding,
        "--chdir",
        str(folder.resolve()),
        "--setenv",
        "HOME",
        str(folder.resolve()),
        "--unsetenv",  # the kernel would watch this (grader's) pid as its parent, which it cannot see
        "JPY_PARENT_PID",
        *drop,
    ]


@functools.cache
def _stub_file() -> Path:
    """The one file every grader-only module reads as in a sandbox (grader_only.STUB), in a folder of its own."""
    folder = Path(tempfile.mkdtemp(prefix="labkit-stub-"))
    folder.chmod(0o755)
    atexit.register(remove_tree, folder, False)
    path = folder / "grader-only-stub.py"
    path.write_text(grader_only.STUB)
    path.chmod(0o644)
    return path


def _hiding_arguments() -> list[str]:
    """bwrap arguments that hide the grader's own modules (grader_only.py): a stub over each one's file, and an
    empty folder over the `__pycache__` beside it, whose `.pyc` files hold the same code compiled."""
    arguments: list[str] = []
    for path in grader_only.source_files():
        arguments += ["--ro-bind", str(_stub_file()), str(path)]
    for folder in grader_only.pycache_folders():
        if folder.is_dir():
            arguments += ["--tmpfs", str(folder)]
    return arguments


@functools.cache
def _uid_block() -> int:
    return _UID_BLOCKS[0] + secrets.randbelow((_UID_BLOCKS[1] - _UID_BLOCKS[0]) // _UID_BLOCKS[2]) * _UID_BLOCKS[2]


def sandbox_uid(slot: int) -> int:
    """The user id of sandbox number `slot` in this run (when the grader is root): drawn at random from
    ids no account uses, so two runs on one machine never share one (and never kill each other's kernels)."""
    return _uid_block() + slot


@functools.cache
def sandbox_problem() -> str | None:
    """None when a sandbox can be made on this machine, else why not (tried once, by making one)."""
    tools = ("bwrap", "prlimit", "setpriv") if switches_user() else ("bwrap", "prlimit")
    missing = [tool for tool in tools if not shutil.which(tool)]
    if missing:
        return f"{', '.join(missing)} not found (install them: apt-get install bubblewrap util-linux)"
    with sandbox_folder(sandbox_uid(0)) as folder:
        command = sandbox_command(folder, sandbox_uid(0), Limits(memory_bytes=None, cpu_seconds=60))
        try:
            probe = subprocess.run(
                [*command, sys.executable, "-c", "import labkit"],
                capture_output=True,
                text=True,
                timeout=_PROBE_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"bubblewrap could not start a sandbox ({error})"
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
        return (
            f"bubblewrap could not start a sandbox here ({last}); it needs user namespaces, or root "
            "(in a container: run it privileged, or with seccomp and AppArmor allowing unshare)"
        )
    return None


def unreadable_in_sandbox(folder: Path) -> list[Path]:
    """Files under `folder` that a sandbox's own user could not read (only a root grader switches user)."""
    if not switches_user() or not folder.is_dir():
        return []
    return [path for path in sorted(folder.rglob("*")) if path.is_file() and not path.stat().st_mode & stat.S_IROTH]


@functools.cache
def sandboxes_root() -> Path:
    """One folder per run for the submissions' folders: others may pass through it but not list it."""
    root = Path(tempfile.mkdtemp(prefix="labkit-grade-"))
    root.chmod(0o711)
    atexit.register(remove_tree, root, False)
    return root


def remove_tree(path: Path, check: bool = True) -> None:
    """Delete `path` and everything below it, however deep or oddly named; with `check`, raise if any is left.

    Not `shutil.rmtree`: it recurses in Python, and a submission that nests folders deeper than
    Python's recursion limit would leave all of it on disk. GNU `rm -rf` walks any depth.
    """
    subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], stderr=subprocess.DEVNULL, check=False)
    if check and os.path.lexists(path):
        raise RuntimeError(f"{path} could not be removed after grading; remove it by hand (rm -rf)")


@contextmanager
def transport_folder(uid: int) -> Iterator[Path]:
    """A folder for a sandboxed kernel's sockets, outside its writable one (so it cannot rename the folder)."""
    folder = Path(tempfile.mkdtemp(prefix="t-", dir=sandboxes_root()))
    try:
        os.chmod(folder, 0o755)
        if switches_user():
            os.chown(folder, uid, uid)
        yield folder
    finally:
        remove_tree(folder)


@contextmanager
def sandbox_folder(uid: int) -> Iterator[Path]:
    """A fresh private folder owned by `uid`; on exit every process of that user is killed and it is deleted."""
    folder = Path(tempfile.mkdtemp(prefix="s-", dir=sandboxes_root()))
    try:
        if switches_user():
            os.chown(folder, uid, uid)
        yield folder
    finally:
        if switches_user():
            kill_processes_of(uid)
        remove_tree(folder)


def processes_of(uid: int) -> list[int]:
    """Host process ids of every process running as `uid`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:  # the Uid line (real, effective, saved, filesystem), which a process cannot hide
            status = (entry / "status").read_text()
        except OSError:  # it ended while we looked
            continue
        uids = next((line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")), [])
        if str(uid) in uids:
            pids.append(int(entry.name))
    return pids


def kill_processes_of(uid: int, timeout: float = 10.0) -> None:
    """SIGKILL every process of `uid` until none is left (they normally are gone with the sandbox already)."""
    deadline = time.monotonic() + timeout
    while pids := processes_of(uid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} of sandbox user {uid} survived SIGKILL for {timeout:g} s")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
