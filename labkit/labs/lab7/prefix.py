"""Lab 7, exercise 2: ``cached_prefix``, the blocks of the longest run of hashes found in the map."""

from __future__ import annotations

from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.kv.prefix_cache import PrefixCachingBlockAllocator, block_hashes
from labkit.kv.prefix_cache import longest_cached_prefix as labkits_cached_prefix
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints
from labkit.labs.lab7.runs import allocator_with, chat_requests
from labkit.labs.lab7.served import BLOCK_SIZE, compare_engine_runs, engine_run, learner_engine_run


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

register_hints(
    "lab7.cached_prefix",
    "A cached prefix is a run of blocks from the prompt's start, each found in the map. It stops at the first miss, "
    "and it must leave the last prompt token to compute: its logits pick the first output token.",
    "Look at no more than (num_prompt_tokens - 1) // block_size hashes. For each in order, cached.get(key) is its "
    "block or None; None ends the run.",
    "blocks = []; for key in hashes[:(num_prompt_tokens - 1) // block_size]: block = cached.get(key); "
    "if block is None: break; blocks.append(block). Return blocks.",
)
