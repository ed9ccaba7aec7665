"""A cgroup per submission where the machine lets the grader make one: a cap on its tasks and on its memory.

Resource limits (`prlimit`) count per process, and a private /tmp is a tmpfs whose pages no
process's limit counts. A cgroup counts the whole submission: every process and thread it
starts (`pids.max`) and all the memory it uses, files in its tmpfs and shared memory included
(cgroup v1 `memory.limit_in_bytes`, v2 `memory.max`). Both versions are tried, the v1 `pids`
and `memory` controllers first (what many container hosts mount), then a v2 tree; where
neither can be written (no root, a read-only /sys/fs/cgroup) the sandbox falls back to
`RLIMIT_NPROC` and a size-limited /tmp alone, and `cgroup_support()` says so.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _own_path(controller: str) -> str | None:
    """This process's cgroup in the v1 hierarchy of `controller` ("" for v2), as /proc/self/cgroup says."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(",") or (controller == "" and controllers == ""):
            return path.lstrip("/")
    return None


def _parents() -> dict[str, Path] | None:
    """Where submissions' cgroups go, per limit file, or None if this machine offers no writable tree."""
    pids, memory = _own_path("pids"), _own_path("memory")
    if pids is not None and memory is not None and (ROOT / "pids").is_dir() and (ROOT / "memory").is_dir():
        return {"pids.max": ROOT / "pids" / pids, "memory.limit_in_bytes": ROOT / "memory" / memory}
    unified = _own_path("")
    if unified is not None and (ROOT / "cgroup.controllers").exists():
        parent = ROOT / unified
        return {"pids.max": parent, "memory.max": parent}
    return None


@contextlib.contextmanager
def submission_cgroup(name: str, max_tasks: int, memory_bytes: int | None) -> Iterator[list[Path]]:
    """Make the cgroups for one submission and yield the `cgroup.procs` files a process joins them by
    (an empty list where none can be made); on exit they are removed (their processes must be gone)."""
    parents = _parents()
    made: list[Path] = []
    try:
        if parents is not None:
            for limit, parent in parents.items():
                folder = parent / name
                if folder not in made:
                    folder.mkdir()
                    made.append(folder)
                value = max_tasks if limit == "pids.max" else memory_bytes
                if value is not None:
                    (folder / limit).write_text(str(value))
    except OSError:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
        made = []
    try:
        yield [folder / "cgroup.procs" for folder in made]
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()


@functools.cache
def memory_limit_problem() -> str | None:
    """None where each submission gets a cgroup that caps its memory (tried once, by making one), else why not."""
    if os.geteuid() != 0:
        return "the grader is not root"
    with submission_cgroup(f"labkit-probe-{os.getpid()}", 64, 1 << 30) as procs:
        return None if procs else "no writable cgroup tree here"


def cgroup_support() -> str:
    """In words: which per-submission cgroup limits this machine gives the grader."""
    if problem := memory_limit_problem():
        return f"no cgroup ({problem}): RLIMIT_NPROC and a size-limited /tmp only"
    kind = "v1 pids and memory controllers" if "memory.limit_in_bytes" in (_parents() or {}) else "v2"
    return f"a cgroup per submission ({kind}): its tasks and all its memory, tmpfs included"


def join_command(procs: list[Path]) -> list[str]:
    """A command prefix that moves the process into the given cgroups, then runs the rest of the command."""
    if not procs:
        return []
    joins = " && ".join(f"echo $$ > '{path}'" for path in procs)
    return ["sh", "-c", f'{joins} && exec "$@"', "labkit-cgroup"]
