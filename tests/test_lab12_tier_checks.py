"""Lab 12's tier decision check: a right reload_or_recompute passes on every seed, and each typical wrong one (written
here as a learner would, not taken from the check's own variants) fails with its mistake named."""

from __future__ import annotations

import pytest

from labkit.engine import LLM
from labkit.grading import evaluate
from labkit.grading.result import NOT_DONE
from labkit.kv import tier_policy
from labkit.labs.lab12 import tier as lab12_tier
from labkit.models import tiny_model
from labkit.sampling import SamplingParams

pytestmark = [pytest.mark.lab12]

EXERCISE = "lab12.reload_or_recompute"


def right(prompt_tokens, cached_tokens, tier_blocks, block_size, costs):
    first = cached_tokens // block_size
    count = max(0, min(tier_blocks, (prompt_tokens - 1) // block_size - first))
    reload = costs.reload_fixed_seconds + count * costs.reload_seconds_per_block
    recompute = count * block_size * costs.recompute_seconds_per_token
    return list(range(first, first + count)) if count and reload < recompute else []


def always(prompt_tokens, cached_tokens, tier_blocks, block_size, costs):
    first = cached_tokens // block_size
    return list(range(first, first + max(0, min(tier_blocks, (prompt_tokens - 1) // block_size - first))))


def per_token(prompt_tokens, cached_tokens, tier_blocks, block_size, costs):
    first = cached_tokens // block_size
    count = max(0, min(tier_blocks, (prompt_tokens - 1) // block_size - first))
    cheaper = (
        costs.reload_fixed_seconds + count * costs.reload_seconds_per_block < count * costs.recompute_seconds_per_token
    )
    return list(range(first, first + count)) if count and cheaper else []


def no_fixed(prompt_tokens, cached_tokens, tier_blocks, block_size, costs):
    first = cached_tokens // block_size
    count = max(0, min(tier_blocks, (prompt_tokens - 1) // block_size - first))
    cheaper = costs.reload_seconds_per_block < block_size * costs.recompute_seconds_per_token
    return list(range(first, first + count)) if count and cheaper else []


def last_block(prompt_tokens, cached_tokens, tier_blocks, block_size, costs):
    return right(prompt_tokens + 1, cached_tokens, tier_blocks, block_size, costs)  # prompt_tokens // block_size


def fixed_per_block(prompt_tokens, cached_tokens, tier_blocks, block_size, costs):
    first = cached_tokens // block_size
    count = max(0, min(tier_blocks, (prompt_tokens - 1) // block_size - first))
    reload = count * (costs.reload_fixed_seconds + costs.reload_seconds_per_block)
    return (
        list(range(first, first + count))
        if count and reload < count * block_size * costs.recompute_seconds_per_token
        else []
    )


def against_one_block(prompt_tokens, cached_tokens, tier_blocks, block_size, costs):
    first = cached_tokens // block_size
    count = max(0, min(tier_blocks, (prompt_tokens - 1) // block_size - first))
    reload = costs.reload_fixed_seconds + count * costs.reload_seconds_per_block
    return (
        list(range(first, first + count)) if count and reload < block_size * costs.recompute_seconds_per_token else []
    )


def as_range(prompt_tokens, cached_tokens, tier_blocks, block_size, costs):
    picked = right(prompt_tokens, cached_tokens, tier_blocks, block_size, costs)
    return range(picked[0], picked[-1] + 1) if picked else range(0)


def from_zero(prompt_tokens, cached_tokens, tier_blocks, block_size, costs):
    return list(range(len(right(prompt_tokens, cached_tokens, tier_blocks, block_size, costs))))


@pytest.mark.parametrize("seed", [0, 1, 7, 42])
@pytest.mark.parametrize("answer", [right, as_range])
def test_a_right_decision_passes_on_every_seed(seed, answer):
    result = evaluate(EXERCISE, answer, seed=seed)
    assert result.passed, result.message


@pytest.mark.parametrize(
    "wrong, named",
    [
        (always, "reloaded the run whatever it costs"),
        (per_token, "cost of computing one token"),
        (no_fixed, "left out reload_fixed_seconds"),
        (last_block, "block that holds the prompt's last token"),
        (from_zero, "start at block 0"),
        (fixed_per_block, "paid reload_fixed_seconds for every block"),
        (against_one_block, "computing one block again"),
    ],
)
@pytest.mark.parametrize("seed", [0, 5, 11, 23, 99])
def test_a_typical_wrong_decision_fails_with_its_mistake_named(wrong, named, seed):
    result = evaluate(EXERCISE, wrong, seed=seed)
    assert not result.passed and named in result.message, result.message
    assert "expected blocks" in result.message


def test_a_wrong_shape_a_blank_and_labkits_own_answer_are_told_apart():
    result = evaluate(EXERCISE, lambda **case: {"reload": True})
    assert not result.passed and "list of ints" in result.message

    def blank(**case):
        raise NotImplementedError("Exercise lab12.reload_or_recompute: replace this line with your code")

    assert evaluate(EXERCISE, blank).status == NOT_DONE
    handed_in = evaluate(EXERCISE, tier_policy.reload_or_recompute)
    assert handed_in.points == 0 and "your code called labkit.kv.tier_policy.reload_or_recompute" in handed_in.message


def test_the_learners_decision_runs_in_the_engine_as_its_reload_policy():
    """The exercise's function, its costs bound, is what LLM takes as reload_policy: a tier too slow never reloads."""
    slow = tier_policy.TierCosts(0.0, 1.0, 1e-6)  # a second per block against a microsecond per token
    model = tiny_model()
    prompt = list(range(2, 42))
    for costs, reloads in [(slow, False), (tier_policy.TierCosts(0.0, 1e-9, 1.0), True)]:
        llm = LLM(
            model,
            num_blocks=6,
            block_size=8,
            max_num_seqs=1,
            max_model_len=64,
            kv_offloading_size=1e-3,
            reload_policy=lambda *args, costs=costs: right(*args, costs),
        )
        params = SamplingParams(max_tokens=4, ignore_eos=True)
        llm.generate([prompt], params, use_tqdm=False)
        llm.generate([list(range(100, 140))], params, use_tqdm=False)  # evicts the first prompt's blocks
        llm.generate([prompt], params, use_tqdm=False)
        assert (llm.kv_tier.reloaded > 0) == reloads, llm.kv_tier.stats()
    assert lab12_tier.MISTAKES  # the module registered its check
