"""A learner's prefix-caching pieces plugged into labkit's allocator, and runs to judge them by (lab 7): the engine
runs on their code while everything else (tables, the map, the collision check) stays labkit's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from labkit.kv.prefix_cache import PrefixCachingBlockAllocator
from labkit.labs.common.engine_runs import CheckRequest, run_requests
from labkit.labs.common.learner_errors import capture, raised_in
from labkit.labs.common.shared import rng


def allocator_with(
    block_hashes: Callable | None = None,
    cached_prefix: Callable | None = None,
    release_block: Callable | None = None,
    pick_block: Callable | None = None,
) -> type[PrefixCachingBlockAllocator]:
    """A prefix-caching allocator class built as ``cls(num_blocks, block_size)`` whose pieces are the given
    functions (labkit's where None), passed to :class:`PrefixCachingBlockAllocator` as its constructor
    arguments. The learner's signatures: ``block_hashes(token_ids, block_size)``; ``cached_prefix(hashes,
    num_prompt_tokens, block_size, cached)``; ``release_block(block, refs, is_cached, free, evictable)``;
    ``pick_block(free, evictable)``.
    """
    pieces = dict(
        block_hashes=block_hashes, cached_prefix=cached_prefix, release_block=release_block, pick_block=pick_block
    )
    pieces = {name: function for name, function in pieces.items() if function is not None}

    class YourPrefixCachingAllocator(PrefixCachingBlockAllocator):
        def __init__(self, num_blocks: int, block_size: int = 16):
            super().__init__(num_blocks, block_size, **pieces)

    return YourPrefixCachingAllocator


# --- requests that share prefixes ------------------------------------------------------------


def chat_requests(seed: int, count: int = 8, system_len: int = 22, spacing: float = 6.0) -> list[CheckRequest]:
    """Seeded chats for the tiny model: most start with one shared system prompt, some repeat a
    question word for word, one has a system prompt of its own; they arrive ``spacing`` ticks apart."""
    r = rng(seed)
    system = [r.randint(2, 255) for _ in range(system_len)]
    other = [r.randint(2, 255) for _ in range(system_len)]
    questions = [[r.randint(2, 255) for _ in range(r.randint(3, 14))] for _ in range(count)]
    requests = []
    for index in range(count):
        head = other if index == count // 2 else system
        question = questions[index - 2] if index >= 3 and index % 3 == 0 else questions[index]
        requests.append(CheckRequest(head + question, r.randint(3, 10), arrival=index * spacing))
    return requests


def serve_counted(requests: list[CheckRequest], allocator, **engine_args) -> dict[str, Any]:
    """Serve with prefix caching on ``allocator``: tokens, and per request the prompt tokens found in the cache."""
    llm, tokens = run_requests(requests, block_allocator=allocator, enable_prefix_caching=True, **engine_args)
    computed: Counter[str] = Counter()
    for step in llm.trace.steps:
        computed.update(step.scheduled)
    # every token a request computed: its prompt tokens not found in the cache, plus one per output token but
    # the last (a preempted request computes again, which both allocators would do alike)
    found = [len(r.prompt_ids) + r.max_tokens - 1 - computed[f"r{i}"] for i, r in enumerate(requests)]
    return {
        "tokens": [tokens[f"r{i}"] for i in range(len(requests))],
        "found": found,
        "hits": sum(step.prefix_cache_hits for step in llm.trace.steps),
        "evictions": llm.state.blocks.num_evictions,
        "preemptions": llm.num_preemptions,
        "blocks_used_at_end": llm.state.blocks.num_used_blocks,
    }


# --- the pool, call by call ------------------------------------------------------------------


@dataclass(frozen=True)
class PoolCall:
    """One call of a script: a sequence takes its cached prefix and blocks for its tokens, or is freed."""

    op: str  # "take" or "free"
    seq: str
    tokens: tuple[int, ...] = ()


def make_call(blocks: PrefixCachingBlockAllocator, call: PoolCall) -> int:
    """Make one call as the engine would; a take returns the prompt tokens found in the cache."""
    if call.op == "free":
        blocks.free(call.seq)
        return 0
    found = blocks.take_cached_prefix(call.seq, call.tokens[:-1])
    blocks.allocate(call.seq, len(call.tokens))
    blocks.cache_full_blocks(call.seq, call.tokens)
    return found


def pool_script(seed: int, block_size: int = 4) -> list[PoolCall]:
    """Seeded takes and frees on a small pool: two holders of one prefix, frees, reuse, then evictions."""
    r = rng(seed)

    def tokens(count: int) -> tuple[int, ...]:
        return tuple(r.randint(2, 255) for _ in range(count))

    system, other = tokens(3 * block_size), tokens(2 * block_size)
    calls = [
        PoolCall("take", "a", system + tokens(r.randint(1, block_size))),
        PoolCall("take", "b", system + tokens(r.randint(block_size + 1, 2 * block_size))),  # shares a's 3 blocks
        PoolCall("take", "c", other + tokens(r.randint(1, block_size - 1))),
        PoolCall("free", "a"),  # b still holds the system prompt's blocks
        PoolCall("free", "b"),
        PoolCall("free", "c"),
        PoolCall("take", "d", system + tokens(2)),  # found on the evictable list
        PoolCall("take", "e", tokens(6 * block_size + 1)),  # never-used blocks first, then evictions
        PoolCall("free", "d"),
        PoolCall("take", "f", other + tokens(block_size)),
        PoolCall("free", "e"),
    ]
    live = ["f"]
    for index in range(8):  # at most two live sequences of at most five blocks: they always fit
        if live and (len(live) >= 2 or r.random() < 0.4):
            calls.append(PoolCall("free", live.pop(r.randrange(len(live)))))
            continue
        head = system if r.random() < 0.5 else other
        calls.append(PoolCall("take", f"s{index}", head + tokens(r.randint(1, 2 * block_size))))
        live.append(f"s{index}")
    return calls + [PoolCall("free", seq) for seq in live]


def run_pool_script(
    allocator_class, calls: list[PoolCall], num_blocks: int = 12, block_size: int = 4, functions: tuple = ()
) -> list[dict]:
    """Each call's prompt tokens found and the pool after it; a call that raises ends the log with the record
    of what was raised, and where in the learner's ``functions``."""
    blocks = allocator_class(num_blocks, block_size)
    log = []
    for call in calls:
        found = capture(functions, lambda: make_call(blocks, call))  # what it raises is judged as a step
        if raised_in(found):
            log.append(found)
            break
        log.append({"found": found, **blocks.pool_state()})
    return log


# --- a block map where two requests point at the same blocks ---------------------------------


def shared_block_snapshot(blocks, lengths: dict[str, int], label: str = ""):
    """The pool with each block owned by the sequence holding it, or by ``"A+B"`` if sequences A and B both do.

    ``lengths`` names the sequences to draw and the tokens each holds; free blocks stay grey,
    also cached ones waiting on the evictable list. Returns a :class:`~labkit.viz.blocks.BlockSnapshot`.
    """
    from labkit.viz.blocks import BlockSnapshot  # matplotlib: only for the picture

    owners: list[str | None] = [None] * blocks.num_blocks
    used = [0] * blocks.num_blocks
    for seq, length in lengths.items():
        for position, block in enumerate(blocks.block_table(seq)):
            owners[block] = seq if owners[block] is None else f"{owners[block]}+{seq}"
            used[block] = max(used[block], max(0, min(blocks.block_size, length - position * blocks.block_size)))
    return BlockSnapshot(tuple(owners), tuple(used), blocks.block_size, label)
