"""Speculative decoding in the engine: greedy outputs never change, drafts are verified in the step's one pass,
rejected KV is rolled back (blocks returned, only final tokens cached), stops are never overrun, bad input is named.

Prompt lookup rarely guesses a random tiny model right, so most tests also plug in an "oracle" proposer
that knows each request's true greedy continuation and spoils some of its tokens: a controlled mix of
accepted and rejected drafts, from which every path (accept all, reject first, reject midway) is exercised.
"""

from __future__ import annotations

import random

import pytest

from labkit.engine import LLM
from labkit.models import tiny_model
from labkit.sampling import SamplingParams

NUM_REQUESTS = 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=0)


@pytest.fixture(scope="module")
def workload(model):
    """Mixed prompt and answer lengths; some prompts repeat themselves so prompt lookup finds something."""
    rng = random.Random(3)
    prompts = []
    for i in range(NUM_REQUESTS):
        length = rng.choice([2, 5, 12, 30, 70])
        prompt = [rng.randrange(2, 256) for _ in range(length)]
        prompts.append(prompt * 2 if i % 3 == 0 else prompt)
    params = [SamplingParams(max_tokens=rng.randrange(1, 40)) for _ in range(NUM_REQUESTS)]
    baseline = LLM(model, num_blocks=400, block_size=4, max_model_len=512).generate(prompts, params, use_tqdm=False)
    return prompts, params, [output.token_ids for output in baseline]


def oracle_proposer(prompts, answers, wrong: float, seed: int = 0):
    """A ``propose`` that knows the true greedy answers and spoils each draft token with probability ``wrong``."""

    def propose(token_ids, k, min_n=1, max_n=4):
        for prompt, answer in zip(prompts, answers):
            if (
                token_ids[: len(prompt)] == prompt
                and token_ids[len(prompt) :] == answer[: len(token_ids) - len(prompt)]
            ):
                rng = random.Random(seed * 7919 + len(token_ids))
                truth = answer[len(token_ids) - len(prompt) :][:k]
                return [t if rng.random() >= wrong else (t + 1) % 256 for t in truth]
        return []

    return propose


def spec_totals(llm):
    steps = llm.trace.steps
    return sum(s.num_draft_tokens for s in steps), sum(s.num_accepted_tokens for s in steps)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_greedy_outputs_are_unchanged_for_every_k(model, workload, k):
    prompts, params, answers = workload
    for propose in (None, oracle_proposer(prompts, answers, wrong=0.3, seed=k)):
        config = {"method": "ngram", "num_speculative_tokens": k}
        if propose is not None:
            config["propose"] = propose
        llm = LLM(model, num_blocks=400, block_size=4, max_model_len=512, speculative_config=config)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        assert [o.token_ids for o in outputs] == answers
        assert llm.state.blocks.num_used_blocks == 0, "blocks leaked"
        drafted, accepted = spec_totals(llm)
        assert 0 <= accepted <= drafted
        if propose is not None:
            assert 0 < accepted < drafted, "the oracle's drafts must be partly accepted, partly rejected"
            assert len(llm.trace.steps) < sum(len(a) for a in answers), "accepted drafts must save steps"


def test_greedy_unchanged_under_preemption_chunking_and_a_tiny_budget(model, workload):
    prompts, params, answers = workload
    config = {"method": "ngram", "num_speculative_tokens": 4, "propose": oracle_proposer(prompts, answers, 0.2)}
    llm = LLM(
        model,
        num_blocks=40,
        block_size=4,
        max_model_len=160,
        max_num_batched_tokens=24,
        speculative_config=config,
    )
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outputs] == answers
    assert llm.num_preemptions > 0, "the small pool should force preemptions"
    assert llm.state.blocks.num_used_blocks == 0
    assert all(step.num_prefill_tokens + step.num_decode_tokens <= 24 for step in llm.trace.steps)
    assert spec_totals(llm)[1] > 0


def test_greedy_unchanged_without_prefix_caching_and_unchunked(model, workload):
    prompts, params, answers = workload
    config = {"method": "ngram", "num_speculative_tokens": 3, "propose": oracle_proposer(prompts, answers, 0.5)}
    llm = LLM(
        model,
        num_blocks=400,
        block_size=4,
        max_model_len=512,
        enable_prefix_caching=False,
        enable_chunked_prefill=False,
        speculative_config=config,
    )
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == answers


def test_a_speculating_request_verifies_1_plus_k_tokens_in_the_same_pass_as_prefills(model, workload):
    prompts, params, answers = workload
    k = 3
    config = {"method": "ngram", "num_speculative_tokens": k, "propose": oracle_proposer(prompts, answers, 0.0)}
    now = [0.0]  # the engine's clock moves 10 ms a pass, so when the late eight join never depends on the CPU's speed
    llm = LLM(model, num_blocks=400, block_size=4, max_model_len=512, speculative_config=config, clock=lambda: now[0])
    run_pass = llm.runner.execute

    def pass_of_10_ms(batch, blocks):
        now[0] += 0.01
        return run_pass(batch, blocks)

    llm.runner.execute = pass_of_10_ms
    llm.generate(prompts, params, arrival_times=[0.0] * 8 + [0.02] * 8, use_tqdm=False)
    sizes = {n for step in llm.trace.steps for n in step.scheduled.values()}
    assert 1 + k in sizes
    mixed = [s for s in llm.trace.steps if s.num_drafts and s.num_prefill_tokens and s.num_decode_tokens > s.num_drafts]
    assert mixed, "no step verified drafts beside a prefill: verification must share the ragged batch"
    for step in llm.trace.steps:
        assert step.num_decode_tokens >= step.num_draft_tokens  # drafts are counted in the step's tokens


def test_only_verified_tokens_name_prefix_cache_blocks(model, workload):
    prompts, params, answers = workload
    config = {"method": "ngram", "num_speculative_tokens": 5, "propose": oracle_proposer(prompts, answers, 0.5)}
    llm = LLM(model, num_blocks=400, block_size=4, max_model_len=512, speculative_config=config)
    named = []
    original = llm.state.blocks.cache_full_blocks

    def recording(seq_id, token_ids):
        named.append((seq_id, list(token_ids)))
        return original(seq_id, token_ids)

    llm.state.blocks.cache_full_blocks = recording
    outputs = llm.generate(prompts, params, use_tqdm=False)
    final = {o.request_id: o.prompt_token_ids + o.token_ids for o in outputs}
    assert named
    for seq_id, token_ids in named:
        assert final[seq_id][: len(token_ids)] == token_ids, f"request {seq_id} cached tokens it never produced"
    # a second run finds the first one's blocks and still answers the same
    again = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in again] == answers
    assert sum(step.prefix_cache_hits for step in llm.trace.steps) > 0


def test_a_draft_model_equal_to_the_target_has_every_draft_accepted(model, workload):
    prompts, params, answers = workload
    config = {"method": "draft_model", "model": model, "num_speculative_tokens": 4}
    llm = LLM(model, num_blocks=400, block_size=4, max_model_len=512, speculative_config=config)
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == answers
    drafted, accepted = spec_totals(llm)
    assert drafted > 0 and accepted == drafted
    assert "draft_model" in llm.describe()["speculative_decoding"]


def test_a_smaller_draft_model_of_the_same_vocabulary_keeps_greedy_outputs(model, workload):
    prompts, params, answers = workload
    draft = tiny_model("llama", seed=1, num_hidden_layers=1)
    config = {"method": "draft_model", "model": draft, "num_speculative_tokens": 2}
    llm = LLM(model, num_blocks=400, block_size=4, max_model_len=512, speculative_config=config)
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == answers
    assert spec_totals(llm)[0] > 0


# --- stops -----------------------------------------------------------------------------------------------
def test_no_token_is_emitted_past_a_stop_token_max_tokens_or_max_model_len(model):
    prompt = [5, 9, 13, 21]
    answer = LLM(model, num_blocks=100, block_size=4).generate([prompt], SamplingParams(max_tokens=30), use_tqdm=False)
    answer = answer[0].token_ids
    stop = answer[6]
    first = answer.index(stop)
    config = {"method": "draft_model", "model": model, "num_speculative_tokens": 5}  # every draft accepted
    llm = LLM(model, num_blocks=100, block_size=4, max_model_len=64, speculative_config=config)
    stopped = llm.generate([prompt], SamplingParams(max_tokens=30, stop_token_ids=(stop,)), use_tqdm=False)[0]
    assert stopped.token_ids == answer[: first + 1] and stopped.finish_reason == "stop"
    capped = llm.generate([prompt], SamplingParams(max_tokens=7), use_tqdm=False)[0]
    assert capped.token_ids == answer[:7] and capped.finish_reason == "length"
    short = LLM(model, num_blocks=100, block_size=4, max_model_len=len(prompt) + 9, speculative_config=config)
    limited = short.generate([prompt], SamplingParams(max_tokens=30), use_tqdm=False)[0]
    assert limited.token_ids == answer[:9] and limited.finish_reason == "length"


# --- bad input ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "config, message",
    [
        ({"method": "medusa", "num_speculative_tokens": 2}, "unknown speculative method 'medusa'.*'ngram'"),
        ({"method": "ngram", "num_speculative_tokens": 0}, ">= 1"),
    ],
)
def test_bad_configs_are_refused_by_the_engine(model, config, message):
    with pytest.raises(ValueError, match=message):
        LLM(model, num_blocks=16, speculative_config=config)


def test_a_draft_model_with_another_vocabulary_is_refused(model):
    other = tiny_model("llama", seed=1, vocab_size=128)
    with pytest.raises(ValueError, match="vocabulary of 128 tokens.*same tokenizer"):
        LLM(
            model,
            num_blocks=16,
            speculative_config={"method": "draft_model", "model": other, "num_speculative_tokens": 2},
        )


def test_a_learner_rule_that_accepts_past_the_first_mismatch_is_named(model):
    def whole_target(draft, target_argmax):
        return list(target_argmax)  # keeps the target's choices after a mismatch, as if the drafts had been right

    draft = tiny_model("llama", seed=1, num_hidden_layers=1)
    config = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3, "accept_greedy": whole_target}
    llm = LLM(model, num_blocks=64, block_size=4, speculative_config=config)
    with pytest.raises(ValueError, match="not an accepted prefix of the drafts followed by exactly one target token"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=20), use_tqdm=False)
