"""Paged attention, reading through block tables, equals dense attention over each sequence."""

import random

import pytest
import torch

from labkit.kv.attention import attention, causal_mask
from labkit.kv.block_allocator import FreeListBlockAllocator
from labkit.kv.paged_attention import paged_attention
from labkit.kv.paged_batch import PagedBatch, SequenceSlice, group_rows
from labkit.kv.paged_cache import PagedKVCache

HEADS, KV_HEADS, DIM, BLOCK = 6, 2, 8, 4


def run_step(seqs, num_blocks=32, device="cpu"):
    """seqs: (name, cached tokens, new tokens). Fill the pool with each sequence's history, then
    attend for the new tokens; return the paged output and the dense reference."""
    torch.manual_seed(0)
    blocks = FreeListBlockAllocator(num_blocks, BLOCK)
    cache = PagedKVCache(1, num_blocks, BLOCK, KV_HEADS, DIM, device=device)
    # scatter the sequences' blocks by interleaving allocations
    for round_ in range(1, 20):
        for name, cached, new in seqs:
            blocks.allocate(name, min(cached + new, round_ * BLOCK))
    history = {
        name: (
            torch.randn(cached + new, KV_HEADS, DIM, device=device),
            torch.randn(cached + new, KV_HEADS, DIM, device=device),
        )
        for name, cached, new in seqs
    }
    ordered = sorted(seqs, key=lambda s: s[2] != 1)
    slices, start, queries, ks, vs = [], 0, [], [], []
    for name, cached, new in ordered:
        k, v = history[name]
        if cached:  # earlier steps wrote these
            prior = PagedBatch.build(
                [SequenceSlice(0, cached, cached, blocks.block_table(name))], BLOCK, torch.device(device), torch.float32
            )
            cache.write(0, k[:cached], v[:cached], prior.slot_mapping)
        slices.append(SequenceSlice(start, new, cached + new, blocks.block_table(name)))
        start += new
        queries.append(torch.randn(new, HEADS, DIM, device=device))
        ks.append(k[cached:])
        vs.append(v[cached:])
    batch = PagedBatch.build(slices, BLOCK, torch.device(device), torch.float32)
    out = cache.attend(0, torch.cat(queries), torch.cat(ks), torch.cat(vs), batch)
    expected = []
    for (name, cached, new), q in zip(ordered, queries):
        k, v = history[name]
        expected.append(attention(q, k, v, causal_mask(new, cached + new, q.device)))
    return out, torch.cat(expected)


@pytest.mark.parametrize(
    "seqs",
    [
        [("a", 0, 1)],  # a one-token prompt
        [("a", 5, 1), ("b", 16, 1), ("c", 0, 1), ("d", 30, 1)],  # decodes of different lengths
        [("a", 0, 9)],  # a fresh prompt
        [("a", 7, 6)],  # a prompt chunk after earlier chunks
        [("p", 0, 13), ("d1", 9, 1), ("c", 8, 5), ("d2", 3, 1)],  # everything mixed
    ],
)
def test_paged_equals_dense(seqs):
    out, expected = run_step(seqs)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_new_tokens_land_in_their_slots():
    cache = PagedKVCache(2, num_blocks=4, block_size=BLOCK, num_kv_heads=KV_HEADS, head_dim=DIM)
    k, v = torch.randn(3, KV_HEADS, DIM), torch.randn(3, KV_HEADS, DIM)
    cache.write(1, k, v, torch.tensor([13, 2, 7]))  # slot 13 = block 3, offset 1
    assert torch.equal(cache.k[1][3, 1], k[0]) and torch.equal(cache.v[1][0, 2], v[1])
    assert torch.equal(cache.k[1][1, 3], k[2]) and cache.k[0].abs().sum() == 0


def test_the_attention_function_can_be_swapped():
    calls = []

    def spy(layer, q, k_pool, v_pool, batch):
        calls.append(layer)
        return paged_attention(layer, q, k_pool, v_pool, batch)

    cache = PagedKVCache(1, 4, BLOCK, KV_HEADS, DIM, attention_fn=spy)
    batch = PagedBatch.build([SequenceSlice(0, 2, 2, [3])], BLOCK, torch.device("cpu"), torch.float32)
    cache.attend(0, torch.randn(2, HEADS, DIM), torch.randn(2, KV_HEADS, DIM), torch.randn(2, KV_HEADS, DIM), batch)
    assert calls == [0]


def test_a_failed_pass_leaves_no_batch_behind():
    """The step's batch is an argument of every call, never state on the cache (no stale batch after an error)."""
    from labkit.engine import LLM
    from labkit.models import tiny_model
    from labkit.sampling import SamplingParams

    failing = [True]

    def flaky(layer, q, k_pool, v_pool, batch):
        if failing[0]:
            raise RuntimeError("attention broke")
        return paged_attention(layer, q, k_pool, v_pool, batch)

    llm = LLM(tiny_model(), policy="continuous", num_blocks=8, block_size=BLOCK, attention=flaky)
    llm.add_request([5, 6, 7], SamplingParams(max_tokens=2, ignore_eos=True), request_id="a")
    with pytest.raises(RuntimeError, match="attention broke"):
        llm.step()
    assert not hasattr(llm.runner.cache, "batch")
    with pytest.raises(TypeError):  # no step in flight: attend cannot run without its batch
        llm.runner.cache.attend(
            0, torch.randn(1, HEADS, DIM), torch.randn(1, KV_HEADS, DIM), torch.randn(1, KV_HEADS, DIM)
        )


def test_decodes_must_come_first():
    with pytest.raises(ValueError, match="single-token sequences before"):
        PagedBatch.build(
            [SequenceSlice(0, 3, 3, [0]), SequenceSlice(3, 1, 4, [1])], BLOCK, torch.device("cpu"), torch.float32
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_paged_equals_dense_on_cuda():
    out, expected = run_step([("p", 0, 13), ("d1", 9, 1), ("c", 8, 5)], device="cuda")
    torch.testing.assert_close(out.cpu(), expected.cpu(), rtol=1e-4, atol=1e-4)


def _padded_cost(widths, runs, group_cost=32):
    return sum((stop - start) * max(widths[start:stop]) + group_cost for start, stop in runs)


def test_decode_rows_are_grouped_by_length_at_the_least_padded_cost():
    assert group_rows([]) == []
    assert group_rows([40] * 8) == [(0, 8)]  # equal lengths: no padding to save
    assert group_rows([40] * 16 + [2] * 48) == [(0, 16), (16, 64)]  # a few long chats, many short ones
    assert group_rows([5, 4, 5, 3]) == [(0, 4)]  # small differences: padding is cheaper than one more call
    generator = random.Random(0)
    for trial in range(60):  # against every way to cut a short list, half of them with repeated widths
        widest = 60 if trial % 2 else 3
        widths = [generator.randint(1, widest) for _ in range(generator.randint(1, 8))]
        runs = group_rows(widths)
        assert runs[0][0] == 0 and runs[-1][1] == len(widths) and all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
        every_cut = [[(0, len(widths))]]
        for mask in range(1, 2 ** (len(widths) - 1)):
            cuts = [i + 1 for i in range(len(widths) - 1) if mask >> i & 1]
            every_cut.append(list(zip([0] + cuts, cuts + [len(widths)])))
        assert _padded_cost(widths, runs) == min(_padded_cost(widths, cut) for cut in every_cut), widths


def test_paged_equals_dense_when_the_decodes_fall_into_several_groups():
    seqs = [(f"long{i}", 70 + i, 1) for i in range(4)] + [(f"short{i}", i, 1) for i in range(40)]
    seqs.append(("prompt", 5, 7))
    decode_widths = [-(-(cached + 1) // BLOCK) for _, cached, new in seqs if new == 1]
    assert len(group_rows(decode_widths)) > 1
    out, expected = run_step(seqs, num_blocks=400)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
