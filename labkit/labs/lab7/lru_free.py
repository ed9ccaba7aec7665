"""Lab 7, exercise 3: ``release_block`` and ``pick_block``, a ref-counted free and an LRU list of cached blocks, the
pool compared with labkit's after every call of a seeded script so that the message names the call."""

from __future__ import annotations

from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.kv.prefix_cache import PrefixCachingBlockAllocator
from labkit.labs.common.diagnose import diagnosed, raised_mismatch
from labkit.labs.hints import register_hints
from labkit.labs.lab7.runs import allocator_with, chat_requests, pool_script, run_pool_script
from labkit.labs.lab7.served import (
    BLOCK_SIZE,
    SCRIPT_POOL,
    TIGHT_POOL,
    compare_engine_runs,
    engine_run,
    learner_engine_run,
)

Pool = dict[str, Any]  # the pool after a call: ref counts, free list, evictable list (LRU order), tables


def _initial_pool() -> dict[str, Any]:
    return {"refs": [0] * SCRIPT_POOL, "free": list(range(SCRIPT_POOL)), "evictable": [], "tables": {}}


def _describe(call) -> str:
    return (
        f"free({call.seq!r})" if call.op == "free" else f"{call.seq!r} takes its prefix and {len(call.tokens)} tokens"
    )


def diagnose_pool(calls, expected_log, got_log) -> Mismatch | None:
    """The first call after which the learner's pool differs from labkit's, with the mistake named if known."""
    for index, (call, want) in enumerate(zip(calls, expected_log)):
        where = f"call {index} ({_describe(call)})"
        if index >= len(got_log):
            return Mismatch(f"{where}: the script stopped before it")
        have = got_log[index]
        if "raised" in have:
            return raised_mismatch(have["raised"], None).within(where)
        if have != want:
            before = expected_log[index - 1] if index else _initial_pool()
            return _pool_mistake(call, before, want, have, where)
    return None


def _pool_mistake(call, before: Pool, want: Pool, have: Pool, where: str) -> Mismatch:
    """How the learner's pool after ``call`` differs from labkit's (``before`` it), the typical mistake first."""
    return (
        _freed_while_held(have, where)
        or _cached_block_to_free_list(have, want, where)
        or (_took_the_wrong_block(before, want, have, where) if call.op == "take" else None)
        or _lru_order(have, want, where)
        or _first_difference(have, want, where)
    )


def _freed_while_held(have: Pool, where: str) -> Mismatch | None:
    still_used = [b for b in have["free"] + have["evictable"] if have["refs"][b] > 0]
    if not still_used:
        return None
    block = still_used[0]
    return Mismatch(
        f"{where}: block {block} went back on a list although another request still holds it "
        f"(ref count {have['refs'][block]}): freeing a block still used by another request",
        "Drop one reference (refs[block] -= 1) and free the block only when that was the last: "
        "if refs[block] is still above 0, return.",
    )


def _cached_block_to_free_list(have: Pool, want: Pool, where: str) -> Mismatch | None:
    for block in have["free"]:
        if block in want["evictable"]:
            return Mismatch(
                f"{where}: cached block {block} went to the free list; it belongs at the end of evictable",
                "A freed block that has a hash (is_cached) stays findable: evictable[block] = None puts it at "
                "the most recent end. Only blocks without a hash go back to the free list.",
            )
    return None


def _took_the_wrong_block(before: Pool, want: Pool, have: Pool, where: str) -> Mismatch | None:
    """A take that evicted the most recent cached block, took the newest free one, or evicted while some were free."""
    taken_want = set(before["evictable"]) - set(want["evictable"])
    taken_have = set(before["evictable"]) - set(have["evictable"])
    order = {block: rank for rank, block in enumerate(before["evictable"])}
    yours = sorted(taken_have - taken_want, key=order.__getitem__)  # oldest first, as evictable was
    labkits = sorted(taken_want - taken_have, key=order.__getitem__)
    if yours and labkits and order[yours[0]] > order[labkits[-1]]:
        return Mismatch(
            f"{where}: you evicted block {yours[-1]}, freed more recently than block {labkits[0]}, which "
            "had waited longest (evicting the most recent instead of the least recent)",
            "evictable is ordered from the least recently freed (first) to the most recent (last). "
            "Evict from the front: evictable.popitem(last=False).",
        )
    kept = len(have["free"])
    if have["free"] != want["free"] and kept < len(before["free"]) and have["free"] == before["free"][:kept]:
        return Mismatch(
            f"{where}: you took block {before['free'][-1]} from the end of the free list, the one freed "
            f"last, instead of block {before['free'][0]} from its front, the one that waited longest "
            "(the wrong end of the free list)",
            "free is a queue: release_block appends to its end and pick_block takes from its front, "
            "free.popleft(), so the block reused is the least recently freed. free.pop() takes the newest.",
        )
    if before["free"] and len(taken_have) > len(taken_want):
        return Mismatch(
            f"{where}: you evicted a cached block while {len(before['free'])} never-used blocks were free",
            "Take from the free list first (free.popleft()); evict a cached block only when it is empty.",
        )
    return None


def _lru_order(have: Pool, want: Pool, where: str) -> Mismatch | None:
    if have["evictable"] != want["evictable"] and sorted(have["evictable"]) == sorted(want["evictable"]):
        return Mismatch(
            f"{where}: the evictable list is {have['evictable']}, expected {want['evictable']} (the LRU order)",
            "Append a freed cached block at the most recent end (evictable[block] = None), so the front is "
            "always the least recently freed.",
        )
    return None


def _first_difference(have: Pool, want: Pool, where: str) -> Mismatch:
    if have["refs"] != want["refs"]:
        block = next(b for b, (h, w) in enumerate(zip(have["refs"], want["refs"])) if h != w)
        return Mismatch(f"{where}: block {block} has ref count {have['refs'][block]}, expected {want['refs'][block]}")
    diff = next(key for key in want if have.get(key) != want[key])
    return Mismatch(f"{where}: the pool's {diff} is {have.get(diff)!r:.120}, expected {want[diff]!r:.120}")


def _run_lru(functions, inputs) -> dict[str, Any]:
    allocator_class = allocator_with(release_block=functions[0], pick_block=functions[1])
    return {
        "log": run_pool_script(allocator_class, inputs["calls"], SCRIPT_POOL, BLOCK_SIZE, tuple(functions)),
        "engine": learner_engine_run(functions, allocator_class, inputs["requests"], TIGHT_POOL),
    }


def _compare_lru(expected, got) -> Mismatch | None:
    mismatch = diagnose_pool(expected["calls"], expected["log"], got["log"])
    if mismatch is not None:
        return mismatch.within(f"in a pool of {SCRIPT_POOL} blocks of {BLOCK_SIZE}")
    return compare_engine_runs(
        expected["engine"],
        got["engine"],
        f"in the engine with your release and pick ({TIGHT_POOL} blocks, so it evicts)",
    )


register(
    diagnosed(
        Exercise(
            id="lab7.lru_free",
            functions=("release_block", "pick_block"),
            answers=("labkit.kv.prefix_cache.release_block", "labkit.kv.prefix_cache.pick_block"),
            make_inputs=lambda seed: {"calls": pool_script(seed, BLOCK_SIZE), "requests": chat_requests(seed)},
            run=_run_lru,
            oracle=lambda inputs: {
                "calls": inputs["calls"],
                "log": run_pool_script(PrefixCachingBlockAllocator, inputs["calls"], SCRIPT_POOL, BLOCK_SIZE),
                "engine": engine_run(PrefixCachingBlockAllocator, inputs["requests"], TIGHT_POOL),
            },
            compare=_compare_lru,
            tested=f"a seeded script of takes and frees on {SCRIPT_POOL} blocks of {BLOCK_SIZE} (two requests "
            "holding one system prompt, frees, reuse from the evictable list, evictions) leaves, after every call, "
            "the same ref counts, free list, evictable list (in LRU order) and tables as labkit's allocator; and the "
            f"engine using them on {TIGHT_POOL} blocks evicts and serves 8 chats like labkit's",
            hint="release: drop one reference, and only the last puts the block on a list (evictable if cached, "
            "else free). pick: never-used first, else the least recently freed. "
            'labkit.hint("lab7.lru_free") shows more.',
            points=2.0,
        )
    )
)

register_hints(
    "lab7.lru_free",
    "A block shared by several requests is free only when nobody holds it (a reference count). A free block with a "
    "hash still holds a reusable prefix: keep it findable, on a list ordered by when it was freed, and reuse it "
    "last, oldest first.",
    "release_block: refs[block] -= 1; if still above 0, stop; else cached blocks go to the end of evictable, others "
    "to the end of free. pick_block: from free if it has any (the never-used), else the front of evictable.",
    "evictable[block] = None appends at the most recent end; free.append(block); free.popleft(); "
    "block, _ = evictable.popitem(last=False).",
)
