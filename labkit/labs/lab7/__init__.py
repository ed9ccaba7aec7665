"""Lab 7, prefix caching: the checks for the learner's hash chain, prefix lookup and ref-count / LRU free.

- ``block_hashes``: one hash per *full* block, each of its parent's hash and its own tokens;
- ``cached_prefix``: the blocks of the longest run of hashes found in the map, stopping at the
  first miss and leaving at least the prompt's last token to compute;
- ``release_block`` and ``pick_block``: a shared block is freed by its last holder; a freed block
  with a hash waits, findable, on an LRU list; new blocks come from the never-used ones first,
  then from the least recently freed cached one.

Each check compares the learner's function with labkit's own on seeded cases, names the typical
mistakes, then plugs it into labkit's prefix-caching allocator
(:func:`~labkit.labs.lab7.runs.allocator_with`) and serves seeded chats that share a
system prompt on the tiny model: the same tokens, and the same prompt tokens found in the cache,
request by request, as the engine with its own allocator.
"""

from __future__ import annotations

from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.kv.prefix_cache import NO_PARENT, PrefixCachingBlockAllocator, block_hash, block_hashes
from labkit.kv.prefix_cache import longest_cached_prefix as labkits_cached_prefix
from labkit.labs.common.diagnose import diagnosed, raised_mismatch
from labkit.labs.common.learner_errors import raised_record
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints
from labkit.labs.lab7.runs import (
    allocator_with,
    chat_requests,
    pool_script,
    run_pool_script,
    serve_counted,
)

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
    try:
        return engine_run(allocator_class, requests, num_blocks)
    except NotImplementedError:
        raise
    except Exception as error:  # judged after the direct cases, which usually say more
        return {"raised": raised_record(error, functions)}


def compare_engine_runs(expected: dict[str, Any], got: dict[str, Any], where: str) -> Mismatch | None:
    """Tokens first (a wrong block serves wrong keys), then the prompt tokens each request found in the cache."""
    if "raised" in got:
        return raised_mismatch(got["raised"], None).within(where)
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


# --- lab7.block_hashes ---------------------------------------------------------------------------


def _hash_cases(seed: int) -> list[tuple[list[int], int]]:
    """Token lists: empty, under a block, exact blocks, a ragged end, and one block's tokens twice in a row."""
    r = rng(seed)
    block = [r.randint(2, 255) for _ in range(BLOCK_SIZE)]
    return [
        ([], BLOCK_SIZE),
        (block[:3], BLOCK_SIZE),
        (block + block + block, BLOCK_SIZE),  # the same tokens at three positions: three different hashes
        ([r.randint(2, 255) for _ in range(11)], BLOCK_SIZE),
        ([r.randint(2, 255) for _ in range(40)], 16),
    ]


def _without_parent(token_ids, block_size) -> list[int]:
    return [
        block_hash(NO_PARENT, token_ids[start : start + block_size])
        for start in range(0, len(token_ids) - block_size + 1, block_size)
    ]


def _hashes(count: int) -> str:
    return f"{count} hash" + ("" if count == 1 else "es")


def _compare_hashes(expected, got) -> Mismatch | None:
    for (tokens, block_size), want, have in zip(expected["cases"], expected["hashes"], got["hashes"]):
        if have == want:
            continue
        where = f"{len(tokens)} tokens in blocks of {block_size}"
        if not isinstance(have, list):
            return Mismatch(f"{where}: expected a list of {len(want)} ints, got {have!r:.80}")
        if len(have) > len(want) and len(want) == len(tokens) // block_size:
            return Mismatch(
                f"{where}: you returned {_hashes(len(have))}, one for the last partial block "
                f"({len(tokens) % block_size} tokens) too; expected {len(want)} (sharing the last partial block)",
                "Only full blocks get a hash: the last partial block is still being written (the next tokens "
                "land in it), so no other request may share it. Stop at len(token_ids) // block_size blocks.",
            )
        if have[: len(want)] == _without_parent(tokens, block_size):
            return Mismatch(
                f"{where}: block 1 got the hash its tokens would have at the start of a prompt "
                "(hashing a block without its parent)",
                "A block's hash must name everything before it, or the same tokens after another prefix would be "
                "found in the cache, with another prefix's keys and values. Hash (the previous block's hash, "
                "this block's tokens): block_hash(parent, tokens), the parent starting at NO_PARENT.",
            )
        return Mismatch(f"{where}: expected hashes {want}, got {have!r:.120}")
    return compare_engine_runs(expected["engine"], got["engine"], "in the engine with your block_hashes")


register(
    diagnosed(
        Exercise(
            id="lab7.block_hashes",
            functions=("block_hashes",),
            answers=("labkit.kv.prefix_cache.block_hashes",),
            make_inputs=lambda seed: {"cases": _hash_cases(seed), "requests": chat_requests(seed)},
            run=lambda functions, inputs: {
                "hashes": [list(functions[0](list(tokens), size)) for tokens, size in inputs["cases"]],
                "engine": learner_engine_run(functions, allocator_with(block_hashes=functions[0]), inputs["requests"]),
            },
            oracle=lambda inputs: {
                "cases": inputs["cases"],
                "hashes": [block_hashes(tokens, size) for tokens, size in inputs["cases"]],
                "engine": engine_run(PrefixCachingBlockAllocator, inputs["requests"]),
            },
            compare=_compare_hashes,
            tested="block_hashes on 5 token lists (empty, under a block, one block's tokens three times, a ragged "
            "end, 40 tokens in blocks of 16) equals labkit's chain, and the engine using it serves 8 chats sharing "
            "a system prompt with the same tokens and the same prompt tokens found in the cache",
            hint="One hash per full block, each made of the previous block's hash and this block's tokens. "
            'labkit.hint("lab7.block_hashes") shows more.',
        )
    )
)

# --- lab7.cached_prefix --------------------------------------------------------------------------


def _prefix_cases(seed: int) -> list[dict[str, Any]]:
    """Prompts in blocks of 4, each with a map holding some of its blocks: which are cached, by block index."""
    r = rng(seed)
    cases = []
    for length, cached_indices in (
        (14, (0, 1)),
        (12, (0, 1, 2)),
        (16, (0, 2, 3)),
        (9, ()),
        (13, (1, 2)),
        (4, (0,)),
        (13, (0, 1, 2)),
    ):
        tokens = [r.randint(2, 255) for _ in range(length)]
        hashes = block_hashes(tokens, BLOCK_SIZE)
        blocks = r.sample(range(100), len(hashes))
        cached = {hashes[i]: blocks[i] for i in cached_indices}
        cached[r.getrandbits(60)] = 100  # some other prompt's block
        cases.append({"hashes": hashes, "num_prompt_tokens": length, "cached": cached, "blocks": blocks})
    return cases


def _compare_prefix(expected, got) -> Mismatch | None:
    for case, want, have in zip(expected["cases"], expected["found"], got["found"]):
        if have == want:
            continue
        hashes, cached, n = case["hashes"], case["cached"], case["num_prompt_tokens"]
        hit = [i for i, key in enumerate(hashes) if key in cached]
        where = f"a prompt of {n} tokens ({len(hashes)} full blocks of {BLOCK_SIZE}; blocks {hit} cached)"
        if not isinstance(have, list):
            return Mismatch(f"{where}: expected a list of block ids, got {have!r:.80}")
        if have == [hashes[i] for i in range(len(want))]:
            return Mismatch(f"{where}: you returned hashes, not blocks", "Return cached[key], the block, for each hit.")
        if len(have) * BLOCK_SIZE >= n:
            return Mismatch(
                f"{where}: you returned {len(have)} blocks, all {n} prompt tokens, so the request would compute "
                f"zero tokens for a fully cached prompt; expected {len(want)} blocks",
                "The engine needs the logits of the prompt's last token to pick the first output token, so at "
                "least that token is computed: look at no more than (num_prompt_tokens - 1) // block_size blocks.",
            )
        run = len(want)
        if len(have) > run and have[:run] == want and run < len(hashes) and hashes[run] not in cached:
            return Mismatch(
                f"{where}: you kept going after block {run} missed (returned {have}, expected {want})",
                "A cached prefix is a run from the start: after a miss, that block's keys and values are not in "
                "the cache, so the blocks after it cannot be used yet. Stop at the first miss.",
            )
        return Mismatch(f"{where}: expected blocks {want}, got {have!r:.120}")
    return compare_engine_runs(expected["engine"], got["engine"], "in the engine with your cached_prefix")


def _run_prefix(functions, inputs) -> dict[str, Any]:
    learner = functions[0]
    found = [
        list(learner(list(c["hashes"]), c["num_prompt_tokens"], BLOCK_SIZE, dict(c["cached"]))) for c in inputs["cases"]
    ]
    engine = learner_engine_run(functions, allocator_with(cached_prefix=learner), inputs["requests"])
    return {"found": found, "engine": engine}


register(
    diagnosed(
        Exercise(
            id="lab7.cached_prefix",
            functions=("cached_prefix",),
            answers=("labkit.kv.prefix_cache.longest_cached_prefix",),
            make_inputs=lambda seed: {"cases": _prefix_cases(seed), "requests": chat_requests(seed)},
            run=_run_prefix,
            oracle=lambda inputs: {
                "cases": inputs["cases"],
                "found": [
                    labkits_cached_prefix(c["hashes"], c["num_prompt_tokens"], BLOCK_SIZE, c["cached"])
                    for c in inputs["cases"]
                ],
                "engine": engine_run(PrefixCachingBlockAllocator, inputs["requests"]),
            },
            compare=_compare_prefix,
            tested="cached_prefix on 7 prompts with maps holding some of their blocks (a warm prefix, a fully cached "
            "prompt, a gap, a cold one, a one-block prompt) equals labkit's lookup, and the engine using it serves 8 "
            "chats sharing a system prompt with the same tokens and the same prompt tokens found in the cache",
            hint="Walk the hashes from the first; take each block the map has, stop at the first miss, and never "
            'take the block holding the last prompt token. labkit.hint("lab7.cached_prefix") shows more.',
        )
    )
)

# --- lab7.lru_free -------------------------------------------------------------------------------


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
        if have == want:
            continue
        before = expected_log[index - 1] if index else _initial_pool()
        on_lists = have["free"] + have["evictable"]
        still_used = [b for b in on_lists if have["refs"][b] > 0]
        if still_used:
            block = still_used[0]
            return Mismatch(
                f"{where}: block {block} went back on a list although another request still holds it "
                f"(ref count {have['refs'][block]}): freeing a block still used by another request",
                "Drop one reference (refs[block] -= 1) and free the block only when that was the last: "
                "if refs[block] is still above 0, return.",
            )
        for block in have["free"]:
            if block in want["evictable"]:
                return Mismatch(
                    f"{where}: cached block {block} went to the free list; it belongs at the end of evictable",
                    "A freed block that has a hash (is_cached) stays findable: evictable[block] = None puts it at "
                    "the most recent end. Only blocks without a hash go back to the free list.",
                )
        if call.op == "take":
            taken_want = set(before["evictable"]) - set(want["evictable"])
            taken_have = set(before["evictable"]) - set(have["evictable"])
            order = {block: rank for rank, block in enumerate(before["evictable"])}
            yours, labkits = (
                sorted(taken_have - taken_want, key=order.get),
                sorted(taken_want - taken_have, key=order.get),
            )
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
        if have["evictable"] != want["evictable"] and sorted(have["evictable"]) == sorted(want["evictable"]):
            return Mismatch(
                f"{where}: the evictable list is {have['evictable']}, expected {want['evictable']} (the LRU order)",
                "Append a freed cached block at the most recent end (evictable[block] = None), so the front is "
                "always the least recently freed.",
            )
        if have["refs"] != want["refs"]:
            block = next(b for b, (h, w) in enumerate(zip(have["refs"], want["refs"])) if h != w)
            return Mismatch(
                f"{where}: block {block} has ref count {have['refs'][block]}, expected {want['refs'][block]}"
            )
        diff = next(key for key in want if have.get(key) != want[key])
        return Mismatch(f"{where}: the pool's {diff} is {have.get(diff)!r:.120}, expected {want[diff]!r:.120}")
    return None


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

# --- hints, from the idea to near-code (labkit.hint) ---------------------------------------------

register_hints(
    "lab7.block_hashes",
    "Two requests may share a block only if everything up to and including it is the same, so a block's name must "
    "cover its own tokens and, through its parent, all before them. A partial last block gets no name.",
    "Walk the full blocks in order (there are len(token_ids) // block_size). Keep the previous block's hash, "
    "starting at NO_PARENT; each block's hash is made of that parent and the block's tokens, and becomes the next "
    "parent.",
    "parent = NO_PARENT; for start in range(0, len(token_ids) - block_size + 1, block_size): "
    "parent = block_hash(parent, token_ids[start:start + block_size]); hashes.append(parent).",
)
register_hints(
    "lab7.cached_prefix",
    "A cached prefix is a run of blocks from the prompt's start, each found in the map. It stops at the first miss, "
    "and it must leave the last prompt token to compute: its logits pick the first output token.",
    "Look at no more than (num_prompt_tokens - 1) // block_size hashes. For each in order, cached.get(key) is its "
    "block or None; None ends the run.",
    "blocks = []; for key in hashes[:(num_prompt_tokens - 1) // block_size]: block = cached.get(key); "
    "if block is None: break; blocks.append(block). Return blocks.",
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
