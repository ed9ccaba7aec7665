"""Decode attention that walks the block tables part by part equals the gather path, on fp32 and bfloat16 pools."""

import pytest
import torch

import labkit.kv.blockwise_attention as blockwise
from labkit.engine.llm import LLM
from labkit.kv.blockwise_attention import blockwise_attention, can_walk_blocks
from labkit.kv.paged_attention import paged_attention
from labkit.kv.paged_batch import PagedBatch, SequenceSlice
from labkit.kv.paged_cache import PagedKVCache
from labkit.models import tiny_model
from labkit.sampling import SamplingParams


def random_step(lengths, heads, kv_heads, block_size, new_tokens=(), dim=8, pool_dtype=torch.float32, seed=0):
    """Random pools and queries; one decode row per length in ``lengths``, then one prefill row per entry of
    ``new_tokens`` (cached tokens, new tokens); every sequence's blocks scattered over the pool."""
    generator = torch.Generator().manual_seed(seed)
    widths = [-(-length // block_size) for length in lengths] + [-(-sum(p) // block_size) for p in new_tokens]
    num_blocks = sum(widths) + 3
    order = torch.randperm(num_blocks, generator=generator).tolist()
    sequences, start, taken = [], 0, 0
    for length in lengths:
        width = -(-length // block_size)
        sequences.append(SequenceSlice(start, 1, length, order[taken : taken + width]))
        start, taken = start + 1, taken + width
    for cached, new in new_tokens:
        width = -(-(cached + new) // block_size)
        sequences.append(SequenceSlice(start, new, cached + new, order[taken : taken + width]))
        start, taken = start + new, taken + width
    shape = (num_blocks, block_size, kv_heads, dim)
    k_pool = torch.randn(shape, generator=generator).to(pool_dtype)
    v_pool = torch.randn(shape, generator=generator).to(pool_dtype)
    q = torch.randn(start, heads, dim, generator=generator)
    return q, k_pool, v_pool, PagedBatch.build(sequences, block_size, torch.device("cpu"), torch.float32)


CASES = [  # decode lengths, query heads, KV heads, block size, prefill rows (cached, new)
    ([1], 4, 4, 4, ()),
    ([5, 16, 1, 30, 17], 6, 2, 4, ()),  # ragged, grouped-query
    ([40, 3, 33, 7, 64, 1, 12], 9, 3, 16, ()),  # the default model's heads
    ([9, 9, 2], 8, 1, 1, ()),  # one KV head, blocks of one token
    ([20, 6], 6, 2, 4, [(0, 9), (7, 6)]),  # decodes beside prefill rows
]


@pytest.mark.parametrize("part_bytes", [1, 10**9], ids=["a block position per part", "one part"])
@pytest.mark.parametrize(("lengths", "heads", "kv_heads", "block_size", "prefills"), CASES)
def test_walking_the_blocks_equals_the_gather(monkeypatch, part_bytes, lengths, heads, kv_heads, block_size, prefills):
    monkeypatch.setattr(blockwise, "PART_BYTES", part_bytes)
    q, k_pool, v_pool, batch = random_step(sorted(lengths, reverse=True), heads, kv_heads, block_size, prefills)
    expected = paged_attention(0, q, k_pool, v_pool, batch)
    torch.testing.assert_close(blockwise_attention(0, q, k_pool, v_pool, batch), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("part_bytes", [1, 10**9], ids=["a block position per part", "one part"])
def test_a_bfloat16_pool_is_read_as_it_is_and_equals_the_gather_over_its_widened_values(monkeypatch, part_bytes):
    monkeypatch.setattr(blockwise, "PART_BYTES", part_bytes)
    q, k_pool, v_pool, batch = random_step([33, 17, 8, 1], 6, 2, 4, [(5, 3)], pool_dtype=torch.bfloat16)
    out = blockwise_attention(0, q, k_pool, v_pool, batch)
    assert out.dtype == torch.float32
    expected = paged_attention(0, q, k_pool.float(), v_pool.float(), batch)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_the_cache_hands_labkits_attention_its_bfloat16_pools_and_a_learners_attention_widened_ones():
    seen = []

    def learners(layer, q, k_pool, v_pool, batch):
        seen.append(k_pool.dtype)
        return paged_attention(layer, q, k_pool, v_pool, batch)

    own = PagedKVCache(1, 8, 4, 2, 8, kv_cache_dtype="bfloat16")
    other = PagedKVCache(1, 8, 4, 2, 8, kv_cache_dtype="bfloat16", attention_fn=learners)
    assert own.reads_pools_directly and not other.reads_pools_directly
    assert not PagedKVCache(1, 8, 4, 2, 8).reads_pools_directly  # fp32 pools: the gather, as measured
    assert not PagedKVCache(1, 8, 4, 2, 8, kv_cache_dtype="fp8").reads_pools_directly
    assert own.nbytes() * 2 == PagedKVCache(1, 8, 4, 2, 8).nbytes()
    batch = PagedBatch.build([SequenceSlice(0, 3, 3, [5])], 4, torch.device("cpu"), torch.float32)
    q, k, v = torch.randn(3, 6, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    out_own, out_other = own.attend(0, q, k, v, batch), other.attend(0, q, k, v, batch)
    assert seen == [torch.float32] and own.k[0].dtype == torch.bfloat16
    torch.testing.assert_close(out_own, out_other, rtol=1e-5, atol=1e-5)


def test_it_refuses_a_device_it_cannot_walk_and_names_the_alternatives():
    assert can_walk_blocks(torch.device("cpu"))
    q, k_pool, v_pool, batch = random_step([3], 2, 2, 4)
    meta = torch.device("meta")
    assert not can_walk_blocks(meta)
    with pytest.raises(ValueError, match="runs on a CPU.*paged_attention"):
        blockwise_attention(0, q.to(meta), k_pool, v_pool, batch)


GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def serve(model, prompts, **settings) -> list[list[int]]:
    llm = LLM(model, max_num_seqs=4, max_model_len=128, num_blocks=64, block_size=4, **settings)
    return [output.token_ids for output in llm.generate(prompts, GREEDY, use_tqdm=False)]


def test_the_tiny_model_serves_the_same_greedy_tokens_with_either_attention(monkeypatch):
    monkeypatch.setattr(blockwise, "PART_BYTES", 1)  # many parts, so the merge is exercised
    model = tiny_model()
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [3] * 19]
    assert serve(model, prompts, attention=blockwise_attention) == serve(model, prompts)

    def own(*args):  # not labkit's own function, so the cache widens the bfloat16 pool before calling it
        return paged_attention(*args)

    assert serve(model, prompts, kv_cache_dtype="bfloat16") == serve(
        model, prompts, kv_cache_dtype="bfloat16", attention=own
    )


def test_the_default_model_serves_the_same_greedy_tokens_with_either_attention(default_model_on_path, monkeypatch):
    monkeypatch.setattr(blockwise, "PART_BYTES", 4096)  # several parts per row
    model, prompts = default_model_on_path, ["Tell me about the sea.", "Why is the sky blue?"]
    assert serve(model, prompts, attention=blockwise_attention) == serve(model, prompts)
