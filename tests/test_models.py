"""labkit's forward pass against transformers' own: logits for prefill and 32 decode steps.

fp32 matrix kernels add up in a different order on each CPU (and on the prepacked and plain
paths), so logits are compared relative to their largest magnitude, and the greedy tokens
must agree wherever transformers' top two are not a near-tie. The tests at the end break one
thing in the forward pass and check that this comparison catches it.
"""

import pytest
import torch
import torch.nn.functional as F

import labkit.models.llama as llama
from labkit.kv.attention import attention, causal_mask
from labkit.models import tiny_model

# Of the largest |logit|: the worst seen across CPUs and matmul paths is about 5e-6.
RELATIVE_TOLERANCE = 3e-5


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


def logits_difference(got: torch.Tensor, expected: torch.Tensor, where: str) -> str | None:
    """Why ``got`` is not ``expected`` to within the tolerance (and the same greedy token), or None."""
    scale = expected.abs().max().item()
    diff = (got - expected).abs().max().item()
    if not diff <= RELATIVE_TOLERANCE * scale:
        return f"{where} logits differ from transformers by {diff:.2e} (largest |logit| {scale:.1f})"
    top2 = expected.topk(2, dim=-1).values
    decided = (top2[..., 0] - top2[..., 1]) > 2 * diff  # not a near-tie at this tolerance
    if not torch.equal(got.argmax(-1)[decided], expected.argmax(-1)[decided]):
        return f"{where} greedy tokens differ from transformers' (not a near-tie)"
    return None


def difference_from_hf(model, prompt: torch.Tensor, steps: int = 32, hf_run=None) -> str | None:
    """The first way labkit's prefill and decode steps differ from transformers', or None (``hf_run``: transformers'
    logits and tokens for this prompt, if already at hand)."""
    if hf_run is None:
        with torch.inference_mode():
            hf_run = hf_prefill_and_decode(model, prompt, steps)
    ref_logits, tokens = hf_run
    logits, cache = model.prefill(prompt)
    problems = [logits_difference(logits, ref_logits[0], "prefill")]
    for step, token in enumerate(tokens):
        problems.append(logits_difference(model.decode(token, cache), ref_logits[step + 1], f"decode step {step}"))
    assert cache.length == len(prompt) + steps
    return next((problem for problem in problems if problem), None)


def assert_matches_hf(model, prompt: torch.Tensor, steps: int = 32):
    problem = difference_from_hf(model, prompt, steps)
    assert problem is None, problem


def random_prompt(model, length: int = 19) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (length,), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3"])
def test_tiny_models_match_transformers(architecture, matmul_path):
    model = tiny_model(architecture, seed=1, prepack=matmul_path)
    assert_matches_hf(model, random_prompt(model))


@pytest.mark.parametrize(
    "rope_scaling",
    [
        {"rope_type": "linear", "factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
)
def test_rope_scaling_variants_match_transformers(rope_scaling, matmul_path):
    model = tiny_model("llama", seed=2, prepack=matmul_path, rope_scaling=rope_scaling, rope_theta=500.0)
    hf_inv_freq = model.hf.model.rotary_emb.inv_freq
    assert torch.allclose(model.inv_freq, hf_inv_freq, rtol=1e-6)
    assert_matches_hf(model, torch.arange(3, 60), steps=8)


@pytest.fixture(scope="module")
def default_model_hf_run(default_model):
    """The prompt, and transformers' logits and tokens for it, computed once for both matmul paths: transformers'
    model runs over the checkpoint's own tensors, the same on either path (prepacking takes copies of its own)."""
    prompt = torch.tensor(default_model.tokenizer.encode("The two phases of serving a language model are"))
    with torch.inference_mode():
        return prompt, hf_prefill_and_decode(default_model, prompt, 32)


def test_default_model_matches_transformers(default_model_on_path, default_model_hf_run):
    prompt, hf_run = default_model_hf_run
    problem = difference_from_hf(default_model_on_path, prompt, 32, hf_run)
    assert problem is None, problem


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
        mask[: len(a), : len(a)] = causal_mask(len(a), len(a))
        mask[len(a) :, len(a) :] = causal_mask(len(b), len(b))
        return attention(q, k, v, mask)

    together = model.forward(
        torch.cat([a, b]), torch.cat([torch.arange(len(a)), torch.arange(len(b))]), block_diagonal_attend
    )
    assert torch.allclose(together[: len(a)], alone[0], atol=1e-5)
    assert torch.allclose(together[len(a) :], alone[1], atol=1e-5)


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


# --- the comparison catches real bugs ------------------------------------------------------


def swapped_rope(x, cos, sin):
    """A classic slip: the rotated copy built as (x2, -x1) instead of (-x2, x1)."""
    half = x.shape[-1] // 2
    return x * cos[:, None, :] + torch.cat([x[..., half:], -x[..., :half]], dim=-1) * sin[:, None, :]


def swapped_gate_and_up(x, gate_up, down):
    """silu applied to the up projection instead of the gate."""
    gate, up = gate_up(x).chunk(2, dim=-1)
    return down(gate * F.silu(up))


@pytest.mark.parametrize("bug, replacement", [("apply_rope", swapped_rope), ("swiglu_mlp", swapped_gate_and_up)])
def test_the_comparison_fails_a_broken_forward_pass(monkeypatch, bug, replacement):
    model = tiny_model("llama", seed=1)
    assert difference_from_hf(model, random_prompt(model), steps=2) is None
    monkeypatch.setattr(llama, bug, replacement)
    problem = difference_from_hf(model, random_prompt(model), steps=2)
    assert problem is not None and "prefill logits differ" in problem


def test_the_comparison_fails_a_wrong_query_to_kv_head_mapping():
    model = tiny_model("llama", seed=1)  # 4 query heads share 2 KV heads: 0,1 -> 0 and 2,3 -> 1
    prompt = random_prompt(model)

    def interleaved_groups(layer, q, k, v):  # 0,2 -> 0 and 1,3 -> 1: the wrong repeat
        group = q.shape[1] // k.shape[1]
        return attention(q, k.repeat(1, group, 1), v.repeat(1, group, 1), causal_mask(len(q), len(q)))

    with torch.inference_mode():
        expected = model.hf(prompt[None]).logits[0]
    right = model.prefill(prompt)[0]
    wrong = model.forward(prompt, torch.arange(len(prompt)), interleaved_groups)
    assert logits_difference(right, expected, "prefill") is None
    assert "prefill logits differ" in logits_difference(wrong, expected, "prefill")
