"""``LLM(deterministic=True)``: a request's tokens are the same however it is served, in fp32, bf16 and int8.

Seeded prompts (half of them sharing a long prefix) are decoded alone, then in random batches, with random
chunk budgets, with the prefix cache cold and warm, with preemption forced by a small pool, and with n-gram
speculation: every greedy token must be identical, and so must every sampled one under a fixed seed. No
near-tie is forgiven: batch-invariant kernels owe the same bits, not close ones, so each greedy token's
log-probability is compared too (its last bits show a change long before a token flips: with
``deterministic=False`` every one of these checks fails on the tiny model, in every precision, on the
AVX2 machine the course was built on).
"""

import random

import pytest
import torch

from labkit.batch_invariant import TILE_ROWS, fixed_order_sum, tiled_linear
from labkit.engine import LLM
from labkit.engine.int8_choice import choose_int8_backend
from labkit.models import tiny_model
from labkit.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PRECISIONS = ["fp32", "bf16", "int8"]
MAX_TOKENS = 12


@pytest.fixture(scope="module", params=PRECISIONS)
def precision(request):
    if request.param == "int8" and not choose_int8_backend().works:
        pytest.skip(f"no int8 kernel here: {choose_int8_backend().reason}")
    return request.param


@pytest.fixture(scope="module")
def model(precision):
    """Plain F.linear (prepack=False): on this course's AVX2 machine MKL's fp32 product changes below 12 rows."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    return tiny_model("llama", seed=3, dtype=dtype, prepack=False)


def engine(model, precision, **dials) -> LLM:
    settings = {"num_blocks": 128, "max_num_seqs": 16, "deterministic": True, **dials}
    return LLM(model, quantization="int8" if precision == "int8" else None, **settings)


def prompts(seed: int = 0, count: int = 10) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(2, 256) for _ in range(40)]
    own = [[rng.randrange(2, 256) for _ in range(rng.choice([1, 5, 17, 33, 70]))] for _ in range(count)]
    return [(shared + tail if i % 2 else tail) for i, tail in enumerate(own)]


def tokens(outputs) -> list:
    """Each answer's tokens, with each token's log-probability where asked for (its last bits show any change)."""
    return [(output.outputs[0].token_ids, output.outputs[0].logprobs) for output in outputs]


GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def alone(model, precision):
    llm = engine(model, precision, enable_prefix_caching=False)
    return [tokens(llm.generate([p], GREEDY, use_tqdm=False))[0] for p in prompts()]


def differing(got: list[list[int]], want: list[list[int]]) -> list[int]:
    return [i for i, (a, b) in enumerate(zip(got, want)) if a != b]


def test_random_batches_and_chunk_budgets_give_each_request_its_tokens_alone(model, precision, alone):
    rng = random.Random(1)
    for trial in range(3):
        order = list(range(len(alone)))
        rng.shuffle(order)
        llm = engine(
            model,
            precision,
            max_num_seqs=rng.choice([2, 3, 7, 16]),
            max_num_batched_tokens=rng.choice([8, 13, 32, 100]),
            enable_prefix_caching=False,
        )
        got = tokens(llm.generate([prompts()[i] for i in order], GREEDY, use_tqdm=False))
        bad = differing(got, [alone[i] for i in order])
        assert not bad, f"{precision}, trial {trial}: prompts {[order[i] for i in bad]} changed with the batch"


def test_the_prefix_cache_cold_and_warm_gives_the_same_tokens(model, precision, alone):
    llm = engine(model, precision, max_num_batched_tokens=24)
    cold = tokens(llm.generate(prompts(), GREEDY, use_tqdm=False))
    warm = tokens(llm.generate(prompts(), GREEDY, use_tqdm=False))
    computed = sum(step.num_prefill_tokens for step in llm.trace.steps)
    assert computed < sum(len(p) for p in prompts()), "the warm run was meant to reuse cached prefixes"
    assert not differing(cold, alone) and not differing(warm, alone), f"{precision}: the prefix cache changed tokens"


def test_preemption_gives_the_same_tokens(model, precision, alone):
    llm = engine(model, precision, num_blocks=18, block_size=8, enable_prefix_caching=False)
    got = tokens(llm.generate(prompts(), GREEDY, use_tqdm=False))
    assert llm.num_preemptions > 0, "the pool was meant to be small enough to preempt"
    assert not differing(got, alone), f"{precision}: preemption changed tokens"


def test_ngram_speculation_gives_the_same_tokens(model, precision, alone):
    llm = engine(model, precision, speculative_config={"method": "ngram", "num_speculative_tokens": 3}, max_num_seqs=5)
    greedy = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)  # speculation records no logprobs
    got = [token_ids for token_ids, _ in tokens(llm.generate(prompts(), greedy, use_tqdm=False))]
    assert not differing(got, [token_ids for token_ids, _ in alone]), f"{precision}: speculation changed tokens"


def test_sampled_tokens_under_a_fixed_seed_are_the_same_alone_and_in_a_batch(model, precision):
    params = [
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.95, seed=100 + i, logprobs=0) for i in range(10)
    ]
    single = engine(model, precision, enable_prefix_caching=False)
    solo = [tokens(single.generate([p], sp, use_tqdm=False))[0] for p, sp in zip(prompts(), params)]
    batched = engine(model, precision, max_num_seqs=4, max_num_batched_tokens=16)
    assert not differing(tokens(batched.generate(prompts(), params, use_tqdm=False)), solo)


def test_a_custom_attention_is_refused_beside_deterministic():
    with pytest.raises(ValueError, match="brings its own attention"):
        LLM(tiny_model("llama", seed=1), num_blocks=8, deterministic=True, attention=lambda *args: None)


def test_fixed_order_sum_is_the_same_for_any_padding_and_batch():
    x = torch.randn(5, 37, generator=torch.Generator().manual_seed(0))
    padded = torch.cat([x, torch.zeros(5, 100)], dim=1)
    assert torch.equal(fixed_order_sum(x), fixed_order_sum(padded))
    assert torch.equal(fixed_order_sum(x)[2:3], fixed_order_sum(x[2:3]))
    assert torch.allclose(fixed_order_sum(x), x.sum(-1), atol=1e-5)


def test_a_tiled_linear_gives_a_row_the_same_bits_at_any_batch():
    generator = torch.Generator().manual_seed(0)
    weight, x = torch.randn(96, 80, generator=generator), torch.randn(3 * TILE_ROWS + 5, 80, generator=generator)
    linear = tiled_linear(lambda rows: torch.nn.functional.linear(rows, weight))
    whole = linear(x)
    assert all(torch.equal(linear(x[i : i + 1])[0], whole[i]) for i in range(0, len(x), 7))
    assert torch.allclose(whole, x @ weight.T, atol=1e-4)
