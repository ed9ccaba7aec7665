"""Lab 7, what every check ends with: seeded chats served with the learner's piece in labkit's prefix-caching
allocator, compared request by request with the same chats on labkit's own allocator."""

from __future__ import annotations

from typing import Any

from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import raised_mismatch
from labkit.labs.common.learner_errors import RAISED, capture
from labkit.labs.lab7.runs import serve_counted

BLOCK_SIZE = 4  # the checks' blocks: small, so short prompts span several
ENGINE_DIALS = dict(max_num_seqs=3, block_size=BLOCK_SIZE)
ROOMY_POOL = 40  # blocks: nothing is evicted
TIGHT_POOL = 20  # blocks: cached blocks are evicted and a request is preempted
SCRIPT_POOL = 12


def engine_run(allocator_class, requests, num_blocks: int = ROOMY_POOL) -> dict[str, Any]:
    """The chats served with prefix caching on an allocator of the class (tokens, prompt tokens found)."""
    return serve_counted(requests, allocator_class(num_blocks, BLOCK_SIZE), **ENGINE_DIALS)


def learner_engine_run(functions, allocator_class, requests, num_blocks: int = ROOMY_POOL) -> dict[str, Any]:
    """:func:`engine_run` with the learner's pieces; what they raise is kept (the checks before it come first)."""
    return capture(functions, lambda: engine_run(allocator_class, requests, num_blocks))


def compare_engine_runs(expected: dict[str, Any], got: dict[str, Any], where: str) -> Mismatch | None:
    """Tokens first (a wrong block serves wrong keys), then the prompt tokens each request found in the cache."""
    if RAISED in got:
        return raised_mismatch(got[RAISED], None).within(where)
    for index, (want, have) in enumerate(zip(expected["tokens"], got["tokens"])):
        if want != have:
            return Mismatch(
                f"{where}, request r{index} said {have[:8]}..., with labkit's allocator {want[:8]}...",
                "A request was given blocks that do not hold its prefix's keys and values (or a block still "
                "in use was handed out again), so the model attended to the wrong cache.",
            )
    for index, (want, have) in enumerate(zip(expected["found"], got["found"])):
        if want != have:
            return Mismatch(
                f"{where}, request r{index} found {have} of its prompt tokens in the cache, with labkit's "
                f"allocator {want}"
            )
    if got["evictions"] != expected["evictions"]:
        return Mismatch(
            f"{where}, {got['evictions']} cached blocks were evicted, with labkit's allocator {expected['evictions']}"
        )
    return None
