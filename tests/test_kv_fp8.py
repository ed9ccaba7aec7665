"""The 8-bit KV cache (``kv_cache_dtype="fp8"``): e4m3 storage at one byte a value, read back in the model's dtype.

Quality is measured, not assumed: greedy tokens on the default model against the fp32 cache. The tiny
random-weight model is too sensitive for that (rounding its K/V to bf16 alone changes a few of its greedy
tokens, to e4m3 more than half), so on it the engine is held to an exact reference instead: the fp32
cache with every value rounded through e4m3 at read time.
"""

import argparse
import random

import pytest
import torch
from lab_sources import solved

from labkit.engine import LLM
from labkit.engine.config import KV_CACHE_DTYPES, EngineConfig
from labkit.kv.attention import attention, causal_mask
from labkit.kv.block_allocator import FreeListBlockAllocator
from labkit.kv.fp8 import FP8_MAX, KV_CACHE_STORAGE, dequantize_fp8, kv_storage_dtype, quantize_fp8
from labkit.kv.paged_attention import paged_attention
from labkit.kv.paged_batch import PagedBatch, SequenceSlice, compact_batch
from labkit.kv.paged_cache import PagedKVCache
from labkit.labs.lab5 import engine_attention
from labkit.models import tiny_model
from labkit.sampling import SamplingParams
from labkit.serve.serve_cli import add_arguments, engine_dials

HEADS, KV_HEADS, DIM, BLOCK = 6, 2, 8, 4
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
# half a step of e4m3: 3 mantissa bits give a relative 1/16 for normal values (from 2^-6 up), and the
# subnormals below have a fixed step of 2^-9
HALF_STEP, SUBNORMAL_HALF_STEP = 1 / 16, 2.0**-10


def seeded_kv(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V as a model makes them: K of a few units with some outliers, V mostly small."""
    generator = torch.Generator().manual_seed(seed)
    k = torch.randn(n, KV_HEADS, DIM, generator=generator) * 3
    k[::7, 0, 0] *= 5
    v = torch.randn(n, KV_HEADS, DIM, generator=generator) * 0.3
    return k, v


def within_half_a_step(got: torch.Tensor, want: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Elementwise: |got - want| at most half an e4m3 step (of the scaled value)."""
    bound = torch.maximum(want.abs() * HALF_STEP, torch.tensor(SUBNORMAL_HALF_STEP * scale))
    return (got - want).abs() <= bound * (1 + 1e-6)


@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_the_fp8_round_trip_is_within_half_an_e4m3_step(scale):
    cache = PagedKVCache(2, 8, BLOCK, KV_HEADS, DIM, kv_cache_dtype="fp8")
    assert cache.k[1].dtype == torch.float8_e4m3fn and cache.nbytes() == 2 * 2 * 8 * BLOCK * KV_HEADS * DIM
    cache.k_scale[1] = cache.v_scale[1] = scale
    k, v = seeded_kv(8 * BLOCK)
    slots = torch.randperm(8 * BLOCK, generator=torch.Generator().manual_seed(1))  # token i -> slot slots[i]
    cache.write(1, k, v, slots)
    keys, values = (pool.flatten(0, 1)[slots] for pool in cache.read(1, torch.arange(8)))
    assert keys.dtype == values.dtype == torch.float32
    assert within_half_a_step(keys, k, scale).all() and within_half_a_step(values, v, scale).all()
    relative = ((keys - k).abs() / k.abs().clamp_min(2.0**-6)).max()
    assert 0 < relative <= HALF_STEP + 1e-6  # ~6%: lossy, but no worse than e4m3's half step
    assert cache.k[0].float().abs().sum() == 0  # the other layer untouched


def test_values_beyond_e4m3_are_clamped_not_nan_and_the_bit_trick_equals_torchs_cast():
    big = torch.tensor([1e4, -1e4, float("inf"), 500.0, 3.0])
    assert dequantize_fp8(quantize_fp8(big), 1.0, torch.float32).tolist() == [FP8_MAX, -FP8_MAX, FP8_MAX, FP8_MAX, 3.0]
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    finite = ~every.float().isnan()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert torch.equal(dequantize_fp8(every, 1.0, dtype)[finite], every.to(dtype)[finite])
        assert torch.equal(dequantize_fp8(every, 0.5, dtype)[finite], every.to(dtype)[finite] * 0.5)


def scattered_step(seqs, num_blocks=32, kv_cache_dtype="auto", attention_fn=paged_attention):
    """seqs: (name, cached tokens, new tokens), their blocks interleaved over the pool; fill the history,
    attend for the new tokens. Returns the output, the batch, the cache and each sequence's full K/V."""
    torch.manual_seed(0)
    blocks = FreeListBlockAllocator(num_blocks, BLOCK)
    cache = PagedKVCache(1, num_blocks, BLOCK, KV_HEADS, DIM, kv_cache_dtype=kv_cache_dtype, attention_fn=attention_fn)
    for round_ in range(1, 20):
        for name, cached, new in seqs:
            blocks.allocate(name, min(cached + new, round_ * BLOCK))
    history = {name: seeded_kv(cached + new, seed=i) for i, (name, cached, new) in enumerate(seqs)}
    ordered = sorted(seqs, key=lambda s: s[2] != 1)
    slices, start, queries, ks, vs = [], 0, [], [], []
    for name, cached, new in ordered:
        k, v = history[name]
        if cached:
            prior = PagedBatch.build(
                [SequenceSlice(0, cached, cached, blocks.block_table(name))], BLOCK, torch.device("cpu"), torch.float32
            )
            cache.write(0, k[:cached], v[:cached], prior.slot_mapping)
        slices.append(SequenceSlice(start, new, cached + new, blocks.block_table(name)))
        start += new
        queries.append(torch.randn(new, HEADS, DIM))
        ks.append(k[cached:])
        vs.append(v[cached:])
    batch = PagedBatch.build(slices, BLOCK, torch.device("cpu"), torch.float32)
    out = cache.attend(0, torch.cat(queries), torch.cat(ks), torch.cat(vs), batch)
    return out, batch, cache, ordered, queries, history


MIXED = [("p", 0, 13), ("d1", 9, 1), ("c", 8, 5), ("d2", 3, 1), ("d3", 30, 1)]


def test_a_compact_batch_reads_what_the_full_pool_reads():
    out, batch, cache, *_ = scattered_step(MIXED)
    blocks, compact = compact_batch(batch, BLOCK)
    assert blocks.tolist() == sorted({b for seq in batch.sequences for b in seq.block_table})
    q = torch.randn(sum(seq.num_query for seq in batch.sequences), HEADS, DIM)
    full = paged_attention(0, q, cache.k[0], cache.v[0], batch)
    small = paged_attention(0, q, cache.k[0][blocks], cache.v[0][blocks], compact)
    assert torch.equal(full, small)
    slots_in_compact = compact.slot_mapping
    assert torch.equal(cache.k[0].flatten(0, 1)[batch.slot_mapping], cache.k[0][blocks].flatten(0, 1)[slots_in_compact])


def test_fp8_attention_equals_dense_attention_over_the_rounded_kv_and_sees_the_models_dtype():
    seen = []

    def spy(layer, q, k_pool, v_pool, batch):
        seen.append((k_pool.dtype, v_pool.dtype))
        return paged_attention(layer, q, k_pool, v_pool, batch)

    out, _, cache, ordered, queries, history = scattered_step(MIXED, kv_cache_dtype="fp8", attention_fn=spy)
    assert seen == [(torch.float32, torch.float32)] and cache.k[0].dtype == torch.float8_e4m3fn

    def rounded(x):
        return dequantize_fp8(quantize_fp8(x), 1.0, torch.float32)

    expected = []
    for (name, cached, new), q in zip(ordered, queries):
        k, v = history[name]
        expected.append(attention(q, rounded(k), rounded(v), causal_mask(new, cached + new, q.device)))
    torch.testing.assert_close(out, torch.cat(expected), rtol=1e-5, atol=1e-5)


def rounding_attention(layer, q, k_pool, v_pool, batch):
    """The reference: an fp32 pool, every value rounded through e4m3 (scale 1.0) as attention reads it."""

    def rounded(pool):
        return quantize_fp8(pool).to(pool.dtype)

    return paged_attention(layer, q, rounded(k_pool), rounded(v_pool), batch)


def tiny_prompts(vocab: int, count: int = 12, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(rng.randrange(3, 24))] for _ in range(count)]


def agreement(reference: list[list[int]], got: list[list[int]]) -> float:
    """The share of the first 8 greedy tokens that match, position by position."""
    return sum(a == b for x, y in zip(reference, got) for a, b in zip(x[:8], y[:8])) / (8 * len(reference))


def serve(model, prompts, **settings) -> list[list[int]]:
    llm = LLM(model, max_model_len=256, **{"num_blocks": 128, **settings})
    return [output.token_ids for output in llm.generate(prompts, GREEDY, use_tqdm=False)]


def test_the_tiny_model_on_an_fp8_cache_serves_exactly_the_rounded_references_tokens():
    model = tiny_model()
    prompts = tiny_prompts(model.config.vocab_size)
    # a pool small enough to preempt, prefix caching on (cached fp8 blocks are reused) and speculation
    busy = dict(
        num_blocks=24,
        block_size=4,
        max_num_seqs=4,
        speculative_config={"method": "ngram", "num_speculative_tokens": 2},
    )
    fp8 = serve(model, prompts, kv_cache_dtype="fp8", **busy)
    assert fp8 == serve(model, prompts, attention=rounding_attention, **busy)
    exact = serve(model, prompts)
    print(f"tiny model, fp8 vs fp32 cache: {agreement(exact, fp8):.0%} of the first 8 greedy tokens agree")


def test_a_learners_attention_runs_unchanged_on_an_fp8_cache():
    model = tiny_model()
    prompts = tiny_prompts(model.config.vocab_size, count=6, seed=1)
    learners = engine_attention(solved("lab5", "paged_attention"))
    assert serve(model, prompts, kv_cache_dtype="fp8", attention=learners) == serve(
        model, prompts, kv_cache_dtype="fp8"
    )


DEFAULT_PROMPTS = [
    "Tell me about the sea.",
    "What is 2+2?",
    "Write a haiku about autumn.",
    "Name three colors.",
    "How do I boil an egg?",
    "Why is the sky blue?",
]


def test_the_default_model_on_an_fp8_cache_mostly_agrees_with_the_fp32_cache(default_model):
    exact = serve(default_model, DEFAULT_PROMPTS)
    fp8 = serve(default_model, DEFAULT_PROMPTS, kv_cache_dtype="fp8")
    share = agreement(exact, fp8)
    print(f"default model, fp8 vs fp32 cache: {share:.0%} of the first 8 greedy tokens agree")
    assert share >= 0.8


@pytest.mark.parametrize(("dtype", "ratio"), [(torch.float32, 4), (torch.bfloat16, 2)])
def test_the_same_memory_holds_more_blocks_in_fp8(monkeypatch, dtype, ratio):
    monkeypatch.setattr("labkit.kv.pool_sizing.available_ram_bytes", lambda: 8 * 1024**2)
    model = tiny_model(dtype=dtype)
    sizes = {}
    for kv in KV_CACHE_DTYPES:
        llm = LLM(model, gpu_memory_utilization=0.5, max_num_seqs=256, kv_cache_dtype=kv)
        sizes[kv] = llm.config.num_blocks, llm.runner.cache.nbytes()
        assert llm.describe()["kv_cache_dtype"] == kv
    (blocks, nbytes), (fp8_blocks, fp8_nbytes) = sizes["auto"], sizes["fp8"]
    assert fp8_blocks // ratio == blocks and abs(fp8_nbytes - nbytes) <= nbytes / blocks
    assert "(fp8)" in LLM(model, gpu_memory_utilization=0.5, kv_cache_dtype="fp8").describe()["kv_pool"]
    bytes_per_token = model.config.kv_bytes_per_token(kv_storage_dtype("fp8", dtype))
    assert bytes_per_token == 2 * model.config.num_layers * model.config.num_kv_heads * model.config.head_dim


def test_a_bad_kv_cache_dtype_is_refused_by_name():
    for bad in ("int8", "fp8_e5m2", "bf16", None, 8):
        with pytest.raises(ValueError, match="kv_cache_dtype must be 'auto'.*'fp8'"):
            EngineConfig(kv_cache_dtype=bad)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(tiny_model(), num_blocks=8, kv_cache_dtype="float8")
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of 'auto', 'bfloat16', 'fp8'"):
        PagedKVCache(1, 4, BLOCK, KV_HEADS, DIM, kv_cache_dtype="int8")
    assert set(KV_CACHE_DTYPES) == set(KV_CACHE_STORAGE)


def test_labkit_serve_takes_vllms_kv_cache_dtype_flag():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert engine_dials(parser.parse_args(["--kv-cache-dtype", "fp8"]))["kv_cache_dtype"] == "fp8"
    assert "kv_cache_dtype" not in engine_dials(parser.parse_args([]))
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "int8"])


def test_the_simulator_and_the_planner_do_not_change():
    from labkit.capacity import LESSON_LLAMA_8B, SALE_GPU
    from labkit.sim import CostModel
    from labkit.sim.simulator import blocks_that_fit, simulate
    from labkit.workloads import sale_workload

    cost = CostModel.from_parts(SALE_GPU, LESSON_LLAMA_8B, overhead_s=0.003)
    workload = sale_workload(40, rate=20.0, seed=1)
    runs = {
        kv: simulate(
            workload, cost, "chunked", num_blocks=blocks_that_fit(SALE_GPU, LESSON_LLAMA_8B), kv_cache_dtype=kv
        )
        for kv in KV_CACHE_DTYPES
    }
    assert runs["fp8"].steps == runs["auto"].steps
    assert runs["fp8"].meta["kv_cache_dtype"] == "fp8"
    assert {key: value for key, value in runs["fp8"].meta.items() if key != "kv_cache_dtype"} == {
        key: value for key, value in runs["auto"].meta.items() if key != "kv_cache_dtype"
    }


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_fp8_round_trip_and_attention_on_cuda():
    cache = PagedKVCache(1, 8, BLOCK, KV_HEADS, DIM, device="cuda", kv_cache_dtype="fp8")
    k, v = seeded_kv(8 * BLOCK)
    cache.write(0, k.cuda(), v.cuda(), torch.arange(8 * BLOCK, device="cuda"))
    keys, values = (pool.flatten(0, 1).cpu() for pool in cache.read(0, torch.arange(8, device="cuda")))
    assert within_half_a_step(keys, k).all() and within_half_a_step(values, v).all()
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    finite = ~every.float().isnan()
    assert torch.equal(dequantize_fp8(every.cuda(), 1.0, torch.float32).cpu()[finite], every.float()[finite])
