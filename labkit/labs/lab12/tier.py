"""Lab 12, the tier's decision: reload a run of blocks found in the slower tier, or compute its tokens again.

``reload_or_recompute`` is the engine's ``reload_policy``, deciding on the learner's own measurements of this machine.
The seeded cases are built so that each typical mistake answers at least one of them wrongly.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.kv.tier_policy import TierCosts, reload_or_recompute
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.mistakes import named_mistake
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints


def _always(prompt_tokens, cached_tokens, tier_blocks, block_size, costs):
    return reload_or_recompute(prompt_tokens, cached_tokens, tier_blocks, block_size, None)


def _per_token(prompt_tokens, cached_tokens, tier_blocks, block_size, costs):
    per_token_only = TierCosts(
        costs.reload_fixed_seconds, costs.reload_seconds_per_block, costs.recompute_seconds_per_token / block_size
    )  # a block's recompute cost taken as one token's
    return reload_or_recompute(prompt_tokens, cached_tokens, tier_blocks, block_size, per_token_only)


def _no_fixed(prompt_tokens, cached_tokens, tier_blocks, block_size, costs):
    free_start = TierCosts(0.0, costs.reload_seconds_per_block, costs.recompute_seconds_per_token)
    return reload_or_recompute(prompt_tokens, cached_tokens, tier_blocks, block_size, free_start)


def _last_block(prompt_tokens, cached_tokens, tier_blocks, block_size, costs):
    return reload_or_recompute(prompt_tokens + 1, cached_tokens, tier_blocks, block_size, costs)


def _fixed_per_block(prompt_tokens, cached_tokens, tier_blocks, block_size, costs):
    picked = reload_or_recompute(prompt_tokens, cached_tokens, tier_blocks, block_size, None)
    reload = len(picked) * (costs.reload_fixed_seconds + costs.reload_seconds_per_block)
    return picked if picked and reload < len(picked) * block_size * costs.recompute_seconds_per_token else []


def _against_one_block(prompt_tokens, cached_tokens, tier_blocks, block_size, costs):
    picked = reload_or_recompute(prompt_tokens, cached_tokens, tier_blocks, block_size, None)
    reload = costs.reload_fixed_seconds + len(picked) * costs.reload_seconds_per_block
    return picked if picked and reload < block_size * costs.recompute_seconds_per_token else []


def _from_zero(prompt_tokens, cached_tokens, tier_blocks, block_size, costs):
    picked = reload_or_recompute(prompt_tokens, cached_tokens, tier_blocks, block_size, costs)
    return list(range(len(picked)))


MISTAKES: dict[str, tuple[Callable[..., list[int]], str]] = {
    "always": (
        _always,
        "You reloaded the run whatever it costs. Reloading is not free: compare reload_fixed_seconds + "
        "blocks * reload_seconds_per_block with the tokens' recompute cost, and return [] when computing is cheaper.",
    ),
    "per token": (
        _per_token,
        "You compared the cost of reloading a block with the cost of computing one token. A block holds block_size "
        "tokens: computing it again costs block_size * recompute_seconds_per_token.",
    ),
    "fixed": (
        _no_fixed,
        "You left out reload_fixed_seconds. A reload pays it once, whatever the number of blocks, so a short run "
        "may be cheaper to compute again.",
    ),
    "fixed per block": (
        _fixed_per_block,
        "You paid reload_fixed_seconds for every block. It is paid once per reload, whatever the number of blocks: "
        "reload = reload_fixed_seconds + blocks * reload_seconds_per_block.",
    ),
    "one block": (
        _against_one_block,
        "You compared reloading the whole run with computing one block again. Compare like with like: the run's "
        "reload against computing all of its blocks' tokens, blocks * block_size * recompute_seconds_per_token.",
    ),
    "last block": (
        _last_block,
        "You reloaded the block that holds the prompt's last token. That token must be computed (its logits give "
        "the first output token), so only the blocks before it count: up to (prompt_tokens - 1) // block_size.",
    ),
    "from zero": (
        _from_zero,
        "Your positions start at block 0. The pool already holds the blocks before cached_tokens; the tier's run "
        "starts where the pool's run ended, at block cached_tokens // block_size.",
    ),
}


def tier_cases(seed: int) -> list[dict[str, Any]]:
    """Six cases, each telling a mistake apart (the makers below say which), drawn from one seeded generator in
    this order."""
    r = rng(seed)
    cases = [_long_run(r)]
    per_token = 1e-3 * _jitter(r)
    cases += [
        _block_dearer_than_a_token(r, per_token),
        _short_run_under_a_fixed_cost(r, per_token),
        _fixed_cost_paid_once(r, per_token),
        _prompt_filling_its_last_block(r),
        _slow_tier(r, per_token),
    ]
    return cases


CASE_BLOCK = 16  # the block size of every case but the one that fills its last block


def _jitter(r: random.Random) -> float:
    return r.uniform(0.8, 1.25)


def _long_run(r: random.Random) -> dict[str, Any]:
    first, long_run_token = r.randint(1, 4), 1e-3 * _jitter(r)
    return dict(
        prompt_tokens=CASE_BLOCK * (first + 8) + r.randint(2, CASE_BLOCK),
        cached_tokens=CASE_BLOCK * first,
        tier_blocks=r.randint(3, 6),
        block_size=CASE_BLOCK,
        # a block reloads at 2 tokens' worth: dearer than a token, far cheaper than its 16 tokens, and the
        # whole run (3-6 blocks) cheaper than one block's recompute
        costs=TierCosts(0.1 * long_run_token, 2 * long_run_token, long_run_token),
    )


def _block_dearer_than_a_token(r: random.Random, per_token: float) -> dict[str, Any]:
    return dict(
        prompt_tokens=CASE_BLOCK * 12 + r.randint(1, CASE_BLOCK),
        cached_tokens=CASE_BLOCK * r.randint(1, 3),
        tier_blocks=5,  # 5 blocks x 4 tokens' worth: more than one block's recompute, less than five's
        block_size=CASE_BLOCK,
        costs=TierCosts(1e-4, 4 * per_token, per_token),  # a block: 4 tokens' worth, under 16
    )


def _short_run_under_a_fixed_cost(r: random.Random, per_token: float) -> dict[str, Any]:
    return dict(
        prompt_tokens=CASE_BLOCK * 10 + r.randint(1, CASE_BLOCK),
        cached_tokens=CASE_BLOCK * r.randint(2, 5),
        tier_blocks=1,
        block_size=CASE_BLOCK,
        costs=TierCosts(30 * per_token, 0.1 * per_token, per_token),  # 16 tokens < fixed 30 + 0.1
    )


def _fixed_cost_paid_once(r: random.Random, per_token: float) -> dict[str, Any]:
    return dict(
        prompt_tokens=CASE_BLOCK * 12 + r.randint(1, CASE_BLOCK),
        cached_tokens=CASE_BLOCK * r.randint(1, 3),
        tier_blocks=4,
        block_size=CASE_BLOCK,
        # 4 blocks: 20 + 4 x 2 = 28 token-costs to reload, 64 to compute: reload. Paying the fixed cost per
        # block (88) or weighing the run against one block (16) says compute.
        costs=TierCosts(20 * per_token, 2 * per_token, per_token),
    )


def _prompt_filling_its_last_block(r: random.Random) -> dict[str, Any]:
    block, start = 8, r.randint(1, 3)
    return dict(
        prompt_tokens=block * (start + 4),  # fills its last block: that block is the tier's fourth
        cached_tokens=block * start,
        tier_blocks=4,
        block_size=block,
        costs=TierCosts(1e-5, 1e-4 * _jitter(r), 1e-3 * _jitter(r)),
    )


def _slow_tier(r: random.Random, per_token: float) -> dict[str, Any]:
    return dict(
        prompt_tokens=CASE_BLOCK * 20 + r.randint(1, CASE_BLOCK),
        cached_tokens=CASE_BLOCK * r.randint(1, 5),
        tier_blocks=r.randint(5, 10),
        block_size=CASE_BLOCK,
        costs=TierCosts(1e-4, 40 * per_token, per_token),  # a disk slower than prefill: never pays
    )


def _oracle(cases: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "right": [reload_or_recompute(**case) for case in cases],
        "wrong": {name: [make(**case) for case in cases] for name, (make, _) in MISTAKES.items()},
    }


def _as_positions(value: Any) -> list[int] | None:
    """A list of whole numbers from a list, tuple or range; None for anything else."""
    if isinstance(value, (list, tuple, range)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return None


def _as_data(value: Any) -> Any:
    """A range of positions as the list it stands for (the grader takes plain data; a range is a fine answer)."""
    return list(value) if isinstance(value, range) else value


def _compare(expected: dict[str, Any], got: list[Any]) -> Mismatch | None:
    answers = [_as_positions(value) for value in got]
    for index, (right, have, raw) in enumerate(zip(expected["right"], answers, got)):
        if have is None:
            return Mismatch(
                f"case {index}: reload_or_recompute returned {type(raw).__name__} {raw!r:.80}",
                "Return the positions to reload as a list of ints, e.g. list(range(first, first + count)), or [].",
            )
        if have == right:
            continue
        by_hint = {hint: expected["wrong"][name] for name, (_, hint) in MISTAKES.items()}
        return Mismatch(f"case {index}: expected blocks {right}, got {have}", named_mistake(by_hint, answers, index))
    return None


register(
    diagnosed(
        Exercise(
            id="lab12.reload_or_recompute",
            functions=("reload_or_recompute",),
            answers=("labkit.kv.tier_policy.reload_or_recompute",),
            make_inputs=tier_cases,
            run=lambda functions, cases: [_as_data(functions[0](**case)) for case in cases],
            oracle=_oracle,
            compare=_compare,
            tested="reload_or_recompute on 6 seeded cases (a long run mid-prompt, a block dearer than a token but "
            "cheaper than its tokens, a short run under a large fixed cost, a long run under a fixed cost worth paying "
            "once, a prompt that fills its last block, a tier slower than prefill): exactly the positions labkit "
            "reloads",
            hint="The run starts at block cached_tokens // block_size and may not reach the block of the prompt's "
            "last token; reload all of it when the fixed cost plus the blocks' cost is below their tokens' recompute "
            'cost, else nothing. labkit.hint("lab12.reload_or_recompute") shows more.',
        )
    )
)

register_hints(
    "lab12.reload_or_recompute",
    "Two costs for the same blocks: a reload pays reload_fixed_seconds once and reload_seconds_per_block per block; "
    "computing them again pays recompute_seconds_per_token for each of their tokens.",
    "first = cached_tokens // block_size; count = max(0, min(tier_blocks, (prompt_tokens - 1) // block_size - first)); "
    "reload list(range(first, first + count)) if count and fixed + count * per_block < count * block_size * "
    "per_token, else [].",
)
