"""Prefix caching in the real engine: the same greedy tokens with it on and off, and its dial."""

import random

import pytest

from labkit.engine import LLM
from labkit.kv.block_allocator import FreeListBlockAllocator
from labkit.kv.prefix_cache import PrefixCachingBlockAllocator
from labkit.metrics import summarize
from labkit.models import tiny_model
from labkit.sampling import SamplingParams


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def shared_prompts(seed: int, count: int, prefix_len: int = 40) -> list[list[int]]:
    r = random.Random(seed)
    prefix = [r.randint(2, 255) for _ in range(prefix_len)]
    return [prefix + [r.randint(2, 255) for _ in range(r.randint(1, 20))] for _ in range(count)]


@pytest.mark.parametrize("policy, budget", [("continuous", None), ("chunked", 32)])
def test_a_pool_too_small_gives_the_same_tokens_with_caching_on_and_off(model, policy, budget):
    prompts = shared_prompts(0, 10)
    runs = {}
    for caching in (True, False):
        llm = LLM(
            model,
            policy=policy,
            num_blocks=30,
            block_size=8,
            max_num_seqs=6,
            max_model_len=128,
            max_num_batched_tokens=budget,
            enable_prefix_caching=caching,
        )
        outputs = llm.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True), use_tqdm=False)
        runs[caching] = ([o.token_ids for o in outputs], llm)
    (on, cached), (off, plain) = runs[True], runs[False]
    assert on == off
    assert cached.num_preemptions > 0 and cached.state.blocks.num_evictions > 0
    hits = sum(step.prefix_cache_hits for step in cached.trace.steps)
    assert hits > 0 and sum(step.num_prefill_tokens for step in cached.trace.steps) < sum(
        step.num_prefill_tokens for step in plain.trace.steps
    )
    summary = summarize(cached.trace)
    assert summary.prefix_cache_hits == hits and 0 < summary.prefix_cache_hit_rate < 1
    assert summarize(plain.trace).prefix_cache_queries == 0
    assert cached.state.blocks.num_used_blocks == 0


def test_aborting_requests_that_hold_shared_blocks_frees_them_all(model):
    llm = LLM(model, policy="continuous", num_blocks=20, block_size=8, max_num_seqs=2, max_model_len=128)
    ids = [llm.add_request(p, SamplingParams(max_tokens=20, ignore_eos=True)) for p in shared_prompts(1, 4)]
    for _ in range(3):
        llm.step()  # two run on shared blocks; the head of the queue holds its cached prefix
    assert llm.state.waiting[0].num_computed_tokens > 0
    for request_id in ids:
        assert llm.abort_request(request_id)
    assert not llm.has_unfinished() and llm.state.blocks.num_used_blocks == 0


def test_the_dial_defaults_on_and_a_plain_allocator_turns_it_off_and_says_so(model):
    assert LLM(model, num_blocks=8).describe()["enable_prefix_caching"] is True
    assert isinstance(LLM(model, num_blocks=8).state.blocks, PrefixCachingBlockAllocator)
    off = LLM(model, num_blocks=8, enable_prefix_caching=False)
    assert type(off.state.blocks) is FreeListBlockAllocator and "prefix_caching" not in off.describe()
    learners = LLM(model, block_allocator=FreeListBlockAllocator(8, 16))
    assert learners.describe()["enable_prefix_caching"] is False
    assert "FreeListBlockAllocator cannot cache prefixes" in learners.describe()["prefix_caching"]


def test_asking_for_prefix_caching_with_a_plain_allocator_names_it(model):
    class LearnersAllocator(FreeListBlockAllocator):
        pass

    with pytest.raises(
        TypeError,
        match="prefix caching needs .* take_cached_prefix, cache_full_blocks, and LearnersAllocator lacks them.*lab 7",
    ):
        LLM(model, num_blocks=8, block_allocator=LearnersAllocator, enable_prefix_caching=True)


def test_chats_sharing_a_system_prompt_answer_the_same_on_the_default_model(default_model):
    system = {
        "role": "system",
        "content": "You are the support assistant of a payments app. Answer in one "
        "short sentence, clearly and politely, and never invent facts.",
    }
    chats = [
        [system, {"role": "user", "content": q}]
        for q in ("Where is my cashback?", "Why was my card declined?", "How do I reset my PIN?")
    ]
    runs = {}
    for caching in (True, False):
        llm = LLM(
            default_model,
            num_blocks=10,
            block_size=16,
            max_num_seqs=3,
            max_model_len=256,
            enable_prefix_caching=caching,
        )
        outputs = llm.generate(chats, SamplingParams(max_tokens=12), use_tqdm=False)
        runs[caching] = [o.token_ids for o in outputs], llm
    assert runs[True][0] == runs[False][0]
    assert sum(step.prefix_cache_hits for step in runs[True][1].trace.steps) > 0
