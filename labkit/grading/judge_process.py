"""Judge one result in a child process under a time and a memory limit.

Loading and comparing what a kernel handed back happens in a process forked from a
fork server that was started before any kernel, with the judge and the lab's checks
already imported. The child gets an address-space limit and is killed when the time
is up, so a result crafted to take minutes or gigabytes costs that child, never the
grader. Only the verdict, a small dataclass, comes back.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import pickle
import resource
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from labkit.grading.attempt import OK, Attempt
from labkit.grading.checks import Exercise, get_exercise
from labkit.grading.judge import judge, verdict
from labkit.grading.result import ERROR, MISSING, NOT_DONE, TIMEOUT, CheckResult
from labkit.grading.result_check import ResultRefused, Size, budget_for, file_limit, load_result, read_result_file

MEMORY_HEADROOM = 2 << 30  # bytes a judging child may allocate beyond what it starts with
_RECORD_STATUSES = {OK, NOT_DONE, ERROR, MISSING}
_CONTEXT = multiprocessing.get_context("forkserver")


def start_judges(lab_modules: list[str]) -> None:
    """Start the fork server now (before any learner code runs) with the judge and the labs' checks imported."""
    _CONTEXT.set_forkserver_preload([__name__, *lab_modules])
    multiprocessing.forkserver.ensure_running()


def judge_result(
    exercise: Exercise, folder: Path, name: str, expected: Any, seconds: float, memory_bytes: int = MEMORY_HEADROOM
) -> CheckResult:
    """The verdict on the result file `folder/name`, judged in a child process that may run `seconds`
    and allocate `memory_bytes` beyond what it starts with."""
    taken = take_result(exercise, folder, name, expected)
    return taken if isinstance(taken, CheckResult) else judge_taken(exercise, taken, expected, seconds, memory_bytes)


def take_result(exercise: Exercise, folder: Path, name: str, expected: Any) -> bytes | CheckResult:
    """The result file's bytes, read now (bounded, without following a link or blocking on a pipe), or
    the verdict on why there are none: the grader takes each result as soon as its exercise has run."""
    try:
        data = read_result_file(folder, name, file_limit(budget_for(expected)))
    except ResultRefused as refused:
        return verdict(exercise, ERROR, str(refused))
    if data is None:
        return verdict(exercise, ERROR, "the grader got no result back from the kernel for this exercise")
    return data


def judge_taken(
    exercise: Exercise, data: bytes, expected: Any, seconds: float, memory_bytes: int = MEMORY_HEADROOM
) -> CheckResult:
    """The verdict on a result's bytes, judged in a child process limited in time and memory."""
    budget = budget_for(expected)
    receiver, sender = _CONTEXT.Pipe(duplex=False)
    child = _CONTEXT.Process(
        target=_judge_in_child, args=(sender, exercise.id, data, pickle.dumps(expected), budget, memory_bytes)
    )
    child.start()
    sender.close()
    try:
        if not receiver.poll(seconds):
            return verdict(exercise, TIMEOUT, f"judging your output took longer than {seconds:g} s, so it was stopped")
        return receiver.recv()
    except EOFError:  # the child died without an answer: killed for its memory, or crashed
        return verdict(exercise, ERROR, "judging your output exhausted the judge (too much memory?), so it was stopped")
    finally:
        child.kill()
        child.join()
        receiver.close()


def _attempt(record: Any) -> Attempt:
    if not isinstance(record, dict) or record.get("status") not in _RECORD_STATUSES:
        raise ResultRefused(
            "the result from the kernel is not in the grader's format (was labkit changed by the notebook?)"
        )
    return Attempt(record["status"], str(record.get("message", "")), record.get("outputs"))


def _limit_memory(extra: int) -> None:
    try:
        with open("/proc/self/status") as status:
            kib = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    except FileNotFoundError:  # not Linux: the time limit still holds
        return
    limit = kib * 1024 + extra
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _judge_in_child(
    sender: Connection, exercise_id: str, data: bytes, expected: bytes, budget: Size, memory_bytes: int
) -> None:
    _limit_memory(memory_bytes)
    exercise = get_exercise(exercise_id)
    try:
        result = judge(exercise, _attempt(load_result(data, budget)), pickle.loads(expected))
    except ResultRefused as refused:
        result = verdict(exercise, ERROR, str(refused))
    except MemoryError:
        result = verdict(exercise, ERROR, "judging your output needed more memory than the judge may use")
    sender.send(result)
