"""Generation: the solo decode every check compares with equals transformers' generate; the engine applies the
chat template, stops where asked and samples reproducibly.

On the default model as labkit loads it (the matmul path this machine's probe chose); each path's
numbers against transformers are proved in test_models.py, under batching in test_engine_default_model.py.
"""

import pytest
import torch

from labkit.engine import LLM
from labkit.engine.reference import solo_greedy
from labkit.models import tiny_model
from labkit.models.tokens import encode_prompt
from labkit.sampling import SamplingParams, filtered_probabilities, sample

CHATS = [
    "Where did my cashback go after the festival sale?",
    "Explain what a KV cache is in two sentences.",
    "Write a haiku about a busy GPU.",
    "What is 17 times 23?",
    "List three tips for writing clear error messages.",
]


@pytest.mark.parametrize("question", CHATS)
def test_the_solo_oracle_equals_hf_generate(default_model, question):
    model = default_model
    ids = encode_prompt(model.tokenizer, [{"role": "user", "content": question}])
    ours = solo_greedy(model, ids, 24).tokens
    with torch.inference_mode():
        out = model.hf.generate(
            torch.tensor([ids]),
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=list(model.config.eos_token_ids),
            pad_token_id=model.config.eos_token_ids[0],
        )
    assert ours == out[0, len(ids) :].tolist()


def generate(model, prompt, params: SamplingParams) -> list[int]:
    """One prompt through the engine, alone: its new token ids."""
    return (
        LLM(model, max_model_len=model.config.max_position_embeddings)
        .generate(prompt, params, use_tqdm=False)[0]
        .token_ids
    )


def test_chat_messages_go_through_the_models_template(default_model):
    question = [{"role": "user", "content": "What is the capital of France?"}]
    (output,) = LLM(default_model).generate(question, SamplingParams(max_tokens=12), use_tqdm=False)
    assert "Paris" in output.text
    assert output.token_ids == solo_greedy(default_model, encode_prompt(default_model.tokenizer, question), 12).tokens


def test_stops_at_eos_and_max_tokens():
    model = tiny_model("llama", seed=5)
    free = generate(model, [3, 4, 5], SamplingParams(max_tokens=40, ignore_eos=True))
    assert len(free) == 40
    stop_at = free[7]
    stopped = generate(model, [3, 4, 5], SamplingParams(max_tokens=40, ignore_eos=True, stop_token_ids=(stop_at,)))
    assert stopped == free[: free.index(stop_at) + 1]


def test_sampling_is_reproducible_with_a_seed():
    model = tiny_model("llama", seed=6)
    params = SamplingParams(max_tokens=20, temperature=1.0, seed=123, ignore_eos=True)
    assert generate(model, [1, 2, 3], params) == generate(model, [1, 2, 3], params)
    other = SamplingParams(max_tokens=20, temperature=1.0, seed=124, ignore_eos=True)
    assert generate(model, [1, 2, 3], params) != generate(model, [1, 2, 3], other)


def test_top_k_and_top_p_keep_only_the_head_of_the_distribution():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    top2 = filtered_probabilities(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (top2[2:] == 0).all() and torch.isclose(top2.sum(), torch.tensor(1.0))
    nucleus = filtered_probabilities(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert nucleus[0] == 1.0  # the top token alone already holds more than half the mass
    gen = torch.Generator().manual_seed(0)
    draws = {int(sample(logits[None], [SamplingParams(temperature=5.0, top_k=2)], [gen])[0]) for _ in range(50)}
    assert draws == {0, 1}


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(temperature=-1), "temperature"),
        (dict(top_p=0), "top_p"),
        (dict(top_k=-2), "top_k"),
    ],
)
def test_bad_sampling_params_are_named(bad, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**bad)


def test_an_answer_that_would_overflow_the_context_stops_at_its_end():
    model = tiny_model("llama")
    (output,) = LLM(model).generate(list(range(100)), SamplingParams(max_tokens=500, ignore_eos=True), use_tqdm=False)
    assert output.finish_reason == "length"
    assert len(output.token_ids) == model.config.max_position_embeddings - 100


def test_text_prompt_without_tokenizer_is_refused():
    with pytest.raises(ValueError, match="no tokenizer"):
        encode_prompt(None, "hello")
    with pytest.raises(ValueError, match="role"):
        encode_prompt(object(), [{"content": "hi"}])
