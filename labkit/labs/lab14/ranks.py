"""Two real processes joined by torch.distributed, each running a learner's function: lab 14's expert parallelism.

A function defined in a notebook cannot be imported by a new process (it lives in the kernel's ``__main__``), so
it travels by value, pickled with cloudpickle (its code and the names it uses), with the work each rank does
around it and that work's inputs. The ranks meet through a file in a fresh
folder (``file://`` rendezvous: no port to pick, none to collide), gloo over loopback on a CPU, NCCL when there
are two GPUs. A rank that does not finish within the deadline (a collective waiting for a partner that never
comes) is killed with its partner, and the call says so instead of hanging; nothing outlives the call.

On Linux with gloo the ranks are forked (milliseconds: torch is already imported); NCCL needs a CUDA context of
its own, which a forked child of a process that used CUDA cannot make, so two GPUs mean spawned ranks.
"""

from __future__ import annotations

import datetime
import faulthandler
import multiprocessing
import multiprocessing.connection
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map_only

from labkit.labs.common.learner_errors import RAISED

WORLD = 2
TIMEOUT_S = 20.0  # gloo's own timeout for a collective; the ranks are killed a few seconds after it
HUNG = "hung"  # the key of the record when the ranks did not finish
GRACE_S = 5.0  # past gloo's timeout, how long the ranks may take to report it before they are killed
AFTER_A_FAILURE_S = 3.0  # how long a rank may still run once its partner has failed


def backend() -> tuple[str, str]:
    """(backend, device) for the two ranks: NCCL over two GPUs where there are two, else gloo on the CPU."""
    return ("nccl", "cuda") if torch.cuda.device_count() >= WORLD else ("gloo", "cpu")


def _start_method(name: str) -> str:
    forkable = sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
    return "fork" if name == "gloo" and forkable else "spawn"


def _loopback() -> str | None:
    """The loopback interface's name (lo on Linux, lo0 on macOS), for gloo to talk over."""
    return next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)


def _rank_main(rank: int, folder: str, sent: bytes, timeout_s: float) -> None:
    """One rank: join the group, run ``work(function, inputs, rank)`` (all three sent pickled), save what it returned."""
    log = open(Path(folder) / f"rank{rank}.log", "w")
    os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    faulthandler.disable()  # a rank that gloo aborts is reported from its log, not by a dump into the kernel's
    torch.set_num_threads(1)
    name, kind = backend()
    if name == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ and _loopback():
        os.environ["GLOO_SOCKET_IFNAME"] = _loopback() or ""
    device = torch.device(f"{kind}:{rank}" if kind == "cuda" else kind)
    if kind == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(
        name, init_method=f"file://{folder}/rendezvous", rank=rank, world_size=WORLD, timeout=timeout
    )
    try:
        function, work, inputs = cloudpickle.loads(sent)
        result = work(function, tree_map_only(torch.Tensor, lambda t: t.to(device), inputs), rank)
        result = tree_map_only(torch.Tensor, lambda t: t.cpu(), result)
    finally:
        dist.destroy_process_group()
    torch.save(result, Path(folder) / f"rank{rank}.pt")
    log.flush()
    os._exit(0)  # at once, without the exit handlers a forked child inherited from the kernel


def _hung(folder: str, seconds: float, finished: list[int]) -> dict[str, Any]:
    waiting = [rank for rank in range(WORLD) if rank not in finished]
    logs = {f"rank {rank}": (Path(folder) / f"rank{rank}.log").read_text()[-400:] for rank in range(WORLD)}
    return {HUNG: {"seconds": seconds, "waiting": waiting, "logs": logs}}


def run_on_two_ranks(function: Any, work: Callable, inputs: Any, timeout_s: float | None = None) -> list[Any]:
    """``work(function, inputs, rank)`` (``function``: the learner's, or a tuple of theirs) in two processes joined as one group, its two results in rank order; or
    ``{HUNG: ...}`` when a rank had not finished ``timeout_s`` + :data:`GRACE_S` after the start (both are then killed)."""
    timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
    name, _ = backend()
    context = multiprocessing.get_context(_start_method(name))
    # by value, all three: the learner's function lives in the kernel's __main__, and in the grading sandbox the
    # check's own modules are hidden from a new process
    sent = cloudpickle.dumps((function, work, tree_map_only(torch.Tensor, lambda t: t.cpu(), inputs)))
    with tempfile.TemporaryDirectory(prefix="labkit-ranks-") as folder:
        args = (folder, sent, timeout_s)
        ranks = [
            context.Process(target=_rank_main, args=(rank, *args), daemon=True)  # type: ignore[attr-defined]
            for rank in range(WORLD)
        ]
        for process in ranks:
            process.start()
        try:
            finished = _wait(ranks, folder, timeout_s + GRACE_S)
            if len(finished) < WORLD and not any(_failed(folder, rank) for rank in finished):
                return [_hung(folder, timeout_s + GRACE_S, finished)]
        finally:
            for process in ranks:
                if process.is_alive():
                    process.kill()
                process.join()
        return [_result(folder, rank, process.exitcode) for rank, process in enumerate(ranks)]


def _wait(ranks: list, folder: str, seconds: float) -> list[int]:
    """The ranks that finished within ``seconds``; once one has failed, its partner gets only
    :data:`AFTER_A_FAILURE_S` more (it is waiting for a collective the failed rank will never join)."""
    deadline, failed_at = time.monotonic() + seconds, None
    while True:
        running = [process for process in ranks if process.exitcode is None]
        finished = [rank for rank, process in enumerate(ranks) if process not in running]
        now = time.monotonic()
        if failed_at is None and any(_failed(folder, rank) for rank in finished):
            failed_at = now
        until = deadline if failed_at is None else min(deadline, failed_at + AFTER_A_FAILURE_S)
        if not running or now >= until:
            return finished
        multiprocessing.connection.wait([process.sentinel for process in running], timeout=until - now)


def _failed(folder: str, rank: int) -> bool:
    """Whether the rank ended without a result, or with the record of an exception."""
    result = _result(folder, rank, None)
    return isinstance(result, dict) and bool({"crashed", RAISED} & set(result))


def _result(folder: str, rank: int, exitcode: int | None) -> Any:
    saved = Path(folder) / f"rank{rank}.pt"
    if saved.exists():
        return torch.load(saved, weights_only=False)
    log = (Path(folder) / f"rank{rank}.log").read_text()
    return {"crashed": {"rank": rank, "exitcode": exitcode, "log": log[-600:]}}
