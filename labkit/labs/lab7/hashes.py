"""Lab 7, exercise 1: ``block_hashes``, one hash per *full* block, each of its parent's hash and its own tokens."""

from __future__ import annotations

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.kv.prefix_cache import NO_PARENT, PrefixCachingBlockAllocator, block_hash, block_hashes
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints
from labkit.labs.lab7.runs import allocator_with, chat_requests
from labkit.labs.lab7.served import BLOCK_SIZE, compare_engine_runs, engine_run, learner_engine_run


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
