"""Speculative decoding on the real default model: greedy answers are those of plain decoding, and prompt
lookup is accepted often on prompts that ask to repeat or edit a given text.

Batched verification of 1 + k tokens runs other matrix shapes than a one-token decode, so an answer may
part from plain decoding at a near-tie (top-2 logits within 1e-4 in the solo run); the test forgives that
and reports how often it happened, as the engine's other default-model tests do. The model alone is
asked in one pass per answer (``teacher_forced``, the same verdict as a token-by-token solo decode;
one answer found by several k is checked once).

On the model as labkit loads it (its matmul path as this machine's probe chose): speculation is
the same code on either path, and each path's numbers are proved against transformers in
test_models.py and under batching in test_engine_default_model.py.
"""

import pytest
from teacher_forced import teacher_forced

from labkit.engine import LLM
from labkit.engine.reference import compare_to_solo
from labkit.metrics import summarize
from labkit.models.tokens import encode_prompt
from labkit.sampling import SamplingParams

TEXT = "The quick brown fox jumps over the lazy dog. The dog sleeps in the warm afternoon sun."
CHATS = [
    f"Repeat this sentence exactly: {TEXT}",
    f"Rewrite this text with 'fox' replaced by 'cat': {TEXT}",
    "What is the capital of France?",
    "Give me three tips for learning to play the guitar.",
]
MAX_TOKENS = 24


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_greedy_answers_do_not_change_with_prompt_lookup(default_model, k):
    prompts = [[{"role": "user", "content": text}] for text in CHATS]
    config = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    llm = LLM(
        default_model,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        num_blocks=64,
        max_model_len=512,
        speculative_config=config,
    )
    outputs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS), use_tqdm=False)
    for output in outputs:
        prompt_ids = encode_prompt(default_model.tokenizer, output.prompt)
        problem = compare_to_solo(
            output.token_ids, teacher_forced(default_model, prompt_ids, output.token_ids, MAX_TOKENS)
        )
        assert problem is None, f"chat {output.prompt[0]['content'][:40]!r} with k={k}: {problem}"
    assert llm.state.blocks.num_free_blocks == 64
    summary = summarize(llm.trace)
    assert summary.spec_decode_num_accepted_tokens > 0, "repeating a given text must accept some drafts"
    assert "ngram" in llm.describe()["speculative_decoding"]


def test_the_default_model_has_no_smaller_sibling_for_a_draft(default_model):
    """SmolLM2-135M is the smallest of its family; a draft model of another vocabulary is refused by name."""
    from labkit.models import tiny_model

    with pytest.raises(ValueError, match="vocabulary of .* tokens but the target"):
        LLM(
            default_model,
            num_blocks=16,
            speculative_config={"method": "draft_model", "model": tiny_model(), "num_speculative_tokens": 2},
        )
