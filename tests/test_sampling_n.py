"""SamplingParams(n=...): several answers to one prompt, grouped per prompt, sharing the prompt's blocks."""

from __future__ import annotations

import pytest
import torch

from labkit.engine import LLM
from labkit.models import tiny_model
from labkit.sampling import SamplingParams

PROMPT = list(range(2, 42))  # 40 tokens: 10 full blocks of 4


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return tiny_model("llama", seed=0)


def test_n_answers_are_grouped_per_prompt_and_seeded_apart(model):
    llm = LLM(model, num_blocks=200, block_size=4)
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=12, ignore_eos=True)
    outputs = llm.generate([PROMPT, [5, 6, 7]], [params, SamplingParams(max_tokens=4)], use_tqdm=False)
    assert len(outputs) == 2
    first, second = outputs
    assert [c.index for c in first.outputs] == [0, 1, 2] and len(second.outputs) == 1
    assert all(len(c.token_ids) == 12 for c in first.outputs)
    assert len({tuple(c.token_ids) for c in first.outputs}) > 1, "answers with their own seeds should differ"
    assert first.token_ids == first.outputs[0].token_ids
    # answer i is what a lone request with seed 11 + i gets
    alone = llm.generate([PROMPT], SamplingParams(temperature=1.0, seed=12, max_tokens=12, ignore_eos=True))
    assert alone[0].token_ids == first.outputs[1].token_ids
    assert llm.state.blocks.num_used_blocks == 0


def test_the_other_answers_find_the_prompt_in_the_prefix_cache(model):
    llm = LLM(model, num_blocks=200, block_size=4)
    llm.generate([PROMPT], SamplingParams(n=4, max_tokens=3), use_tqdm=False)
    hits = sum(step.prefix_cache_hits for step in llm.trace.steps)
    assert hits == 3 * 36  # each of the 3 others skips the prompt's full blocks (the last token is recomputed)
    greedy = [c.token_ids for c in llm.generate([PROMPT], SamplingParams(n=2, max_tokens=5))[0].outputs]
    assert greedy[0] == greedy[1]


def test_without_prefix_caching_n_still_works(model):
    llm = LLM(model, num_blocks=200, block_size=4, enable_prefix_caching=False)
    outputs = llm.generate([PROMPT], SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=4), use_tqdm=False)
    assert len(outputs[0].outputs) == 2


def test_bad_n_and_the_step_api_are_explained(model):
    with pytest.raises(ValueError, match="n \\(answers per prompt\\)"):
        SamplingParams(n=0)
    llm = LLM(model, num_blocks=16, block_size=4)
    with pytest.raises(ValueError, match="generate\\(\\) groups per prompt"):
        llm.add_request([1, 2, 3], SamplingParams(n=2))
