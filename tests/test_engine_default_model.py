"""The engine on the real default model: ten chat prompts, batched, say what they say alone.

Greedy tokens under continuous batching and chunked prefill must match each prompt decoded
alone, except from a near-tie on (solo top-2 logits within 1e-4), which the test reports.
The model alone is asked in one pass per answer (``teacher_forced``: the same verdict as a
token-by-token solo decode, a tenth of the model steps); its token-by-token decode is proven
against transformers' ``generate`` in test_generation.py.
"""

import pytest
from teacher_forced import teacher_forced

from labkit.engine import LLM
from labkit.engine.reference import compare_to_solo
from labkit.models.tokens import encode_prompt
from labkit.sampling import SamplingParams

CHATS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain in one sentence why the sky is blue.",
    "Give me three tips for learning to play the guitar.",
    "How do I boil an egg?",
    "Translate 'good morning' into Spanish.",
    "What is 17 times 3?",
    "Suggest a name for a friendly robot.",
    "Why do cats purr?",
    "Summarise the plot of Romeo and Juliet in two sentences.",
]  # ten chats for eight seats: two wait for a seat
MAX_TOKENS = 12  # four answers end before it (5, 8, 9 and 11 tokens), so the batches change as they end


@pytest.mark.parametrize("policy, budget", [("continuous", None), ("chunked", 64)])
def test_chat_prompts_match_solo_decoding(default_model_on_path, policy, budget):
    model = default_model_on_path
    prompts = [[{"role": "user", "content": text}] for text in CHATS]
    llm = LLM(
        default_model_on_path,
        policy=policy,
        max_num_seqs=8,
        max_num_batched_tokens=budget,
        num_blocks=128,
        max_model_len=512,
    )
    outputs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS), use_tqdm=False)
    near_ties = 0
    for output in outputs:
        solo = teacher_forced(model, encode_prompt(model.tokenizer, output.prompt), output.token_ids, MAX_TOKENS)
        problem = compare_to_solo(output.token_ids, solo)
        assert problem is None, f"chat {output.request_id} ({output.prompt[0]['content']!r}): {problem}"
        near_ties += output.token_ids != solo.tokens  # compare_to_solo forgave them: a near-tie
    print(f"{policy}: {near_ties} of {len(CHATS)} chats parted from solo at a near-tie (top-2 gap < 1e-4)")
    assert all(output.text for output in outputs)
    assert llm.state.blocks.num_free_blocks == 128
