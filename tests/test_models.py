"""labkit's forward pass against transformers' own: logits for prefill and 32 decode steps."""

import pytest
import torch

from labkit.models import tiny_model
from labkit.models.attention import attention, causal_mask

TOLERANCE = 1e-4


def hf_prefill_and_decode(model, prompt: torch.Tensor, steps: int):
    """Transformers' logits for the prompt, then for each greedy next token using its KV cache."""
    out = model.hf(prompt[None], use_cache=True)
    logits = [out.logits[0]]
    past, token = out.past_key_values, out.logits[0, -1].argmax()
    tokens = []
    for _ in range(steps):
        tokens.append(int(token))
        out = model.hf(token.view(1, 1), past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits.append(out.logits[0, -1])
        token = out.logits[0, -1].argmax()
    return logits, tokens


def assert_matches_hf(model, prompt: torch.Tensor, steps: int = 32):
    with torch.inference_mode():
        ref_logits, tokens = hf_prefill_and_decode(model, prompt, steps)
    logits, cache = model.prefill(prompt)
    diff = (logits - ref_logits[0]).abs().max().item()
    assert diff <= TOLERANCE, f"prefill logits differ from transformers by {diff:.2e}"
    for step, token in enumerate(tokens):
        got = model.decode(token, cache)
        diff = (got - ref_logits[step + 1]).abs().max().item()
        assert diff <= TOLERANCE, f"decode step {step} logits differ from transformers by {diff:.2e}"
    assert cache.length == len(prompt) + steps


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3"])
def test_tiny_models_match_transformers(architecture):
    model = tiny_model(architecture, seed=1)
    prompt = torch.randint(0, model.config.vocab_size, (19,), generator=torch.Generator().manual_seed(0))
    assert_matches_hf(model, prompt)


@pytest.mark.parametrize("rope_scaling", [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
])
def test_rope_scaling_variants_match_transformers(rope_scaling):
    model = tiny_model("llama", seed=2, rope_scaling=rope_scaling, rope_theta=500.0)
    hf_inv_freq = model.hf.model.rotary_emb.inv_freq
    assert torch.allclose(model.inv_freq, hf_inv_freq, rtol=1e-6)
    assert_matches_hf(model, torch.arange(3, 60), steps=8)


def test_default_model_matches_transformers(default_model):
    prompt = torch.tensor(default_model.tokenizer.encode("The two phases of serving a language model are"))
    assert_matches_hf(default_model, prompt, steps=32)


def test_default_model_shape_is_smollm2(default_model):
    cfg = default_model.config
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 9, 3, 64)
    assert 134e6 < default_model.num_parameters() < 136e6
    assert cfg.kv_bytes_per_token(torch.float32) == 2 * 30 * 3 * 64 * 4
    assert cfg.kv_bytes_per_token(torch.bfloat16) == 2 * 30 * 3 * 64 * 2


def test_cache_tensors_have_the_formula_size(default_model):
    _, cache = default_model.prefill(list(range(10, 50)))
    assert cache.nbytes() == 40 * default_model.config.kv_bytes_per_token(default_model.dtype)


def test_ragged_batch_equals_separate_sequences():
    """Two sequences in one flat pass give the same logits as each alone."""
    model = tiny_model("llama", seed=3)
    a, b = torch.arange(5, 17), torch.arange(40, 47)
    alone = [model.prefill(a)[0], model.prefill(b)[0]]

    def block_diagonal_attend(layer, q, k, v):
        mask = torch.zeros(len(q), len(q), dtype=torch.bool)
        mask[:len(a), :len(a)] = causal_mask(len(a), len(a))
        mask[len(a):, len(a):] = causal_mask(len(b), len(b))
        return attention(q, k, v, mask)

    together = model.forward(torch.cat([a, b]), torch.cat([torch.arange(len(a)), torch.arange(len(b))]),
                             block_diagonal_attend)
    assert torch.allclose(together[:len(a)], alone[0], atol=1e-5)
    assert torch.allclose(together[len(a):], alone[1], atol=1e-5)


def test_logits_indices_selects_rows():
    model = tiny_model("llama", seed=4)
    ids = torch.arange(10)
    full = model.prefill(ids)[0]
    from labkit.kv.contiguous import ContiguousKVCache
    some = model.forward(ids, torch.arange(10), ContiguousKVCache(2).attend, torch.tensor([3, 9]))
    assert torch.allclose(some, full[[3, 9]], atol=1e-6)


def test_attention_rejects_uneven_head_groups():
    with pytest.raises(ValueError, match="cannot share"):
        attention(torch.zeros(2, 5, 4), torch.zeros(2, 2, 4), torch.zeros(2, 2, 4))


def test_unknown_architecture_is_refused():
    from labkit.models.config import ModelConfig

    class FakeConfig:
        model_type = "gpt2"

    with pytest.raises(ValueError, match="not supported"):
        ModelConfig.from_hf(FakeConfig(), "x")
