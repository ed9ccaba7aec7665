"""The slower KV tier for evicted prefix blocks: exact, bounded, off by default, and in the engine the same greedy
tokens with fewer prompt tokens computed when a conversation returns after its blocks left a small pool."""

from __future__ import annotations

import argparse
import random

import pytest
import torch

from labkit.engine import LLM
from labkit.engine.config import EngineConfig
from labkit.engine.interfaces import MissingPartError
from labkit.kv.block_allocator import FreeListBlockAllocator
from labkit.kv.prefix_cache import PrefixCachingBlockAllocator
from labkit.kv.tier import DiskTier, HostTier, read_block
from labkit.models import tiny_model
from labkit.sampling import SamplingParams
from labkit.serve import serve_cli
from labkit.serve.prometheus import ServerMetrics

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)
POOL = dict(num_blocks=12, block_size=8, max_num_seqs=2, max_model_len=128)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def tier_gib(model, blocks: int, block_size: int = 8, dtype=torch.float32) -> float:
    """The kv_offloading_size that holds exactly ``blocks`` blocks of ``model``."""
    return blocks * block_size * model.config.kv_bytes_per_token(dtype) / 2**30


def conversations(seed: int, length: int = 40) -> tuple[list[int], list[int], list[int]]:
    r = random.Random(seed)
    return tuple([r.randint(2, 255) for _ in range(length)] for _ in range(3))  # type: ignore[return-value]


def returning_conversation(llm: LLM, seed: int = 0, on_evicted=None) -> tuple[list[int], int]:
    """Conversation A, then B and C (which evict A's blocks from the small pool), then A's next turn; its greedy
    tokens and the prompt tokens that last run computed."""
    a, b, c = conversations(seed)
    reply = llm.generate([a], GREEDY, use_tqdm=False)[0].token_ids
    if on_evicted is not None:
        on_evicted(llm, a)
    llm.generate([b, c], GREEDY, use_tqdm=False)
    next_turn = a + reply + [5, 6, 7, 8, 9, 10, 11, 12]
    tokens = llm.generate([next_turn], GREEDY, use_tqdm=False)[0].token_ids
    return tokens, sum(step.num_prefill_tokens for step in llm.trace.steps)


# --- the tier alone ------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [HostTier, DiskTier], ids=["host", "disk"])
def test_a_tier_gives_back_exactly_what_it_kept_and_drops_the_least_recently_used(make, tmp_path):
    tier = make(3) if make is HostTier else make(3, tmp_path)
    blocks = {key: torch.randn(2, 2, 4, 1, 3) for key in (-7, 11, 12, 13)}
    for key in (-7, 11, 12):
        tier.put(key, blocks[key])
    assert torch.equal(tier.get(-7), blocks[-7])  # -7 is now the most recently used: 11 goes first
    tier.put(13, blocks[13])
    assert len(tier) == 3 and not tier.holds(11) and all(tier.holds(k) for k in (-7, 12, 13))
    assert (tier.spilled, tier.reloaded, tier.dropped) == (4, 1, 1)
    assert tier.held_run([12, 13, 11, -7]) == 2 and tier.misses == 1
    for key in (-7, 12, 13):
        assert torch.equal(tier.get(key), blocks[key])
    with pytest.raises(KeyError, match="holds no block 11"):
        tier.get(11)
    if make is DiskTier:
        assert len(list(tmp_path.iterdir())) == 3  # a dropped block's file goes too


@pytest.mark.parametrize("capacity", [0, -1, 2.5, True])
def test_a_tier_of_no_blocks_is_refused(capacity):
    with pytest.raises(ValueError, match="at least 1 block"):
        HostTier(capacity)


# --- in the engine -------------------------------------------------------------------------------------


def test_off_by_default_nothing_changes(model):
    llm = LLM(model, **POOL)
    assert llm.kv_tier is None and llm.state.blocks.tier is None and llm.runner.tier is None
    assert llm.describe()["kv_offloading"] == "off" and "kv_tier" not in llm.describe()
    returning_conversation(llm)
    assert llm.state.blocks.num_evictions > 0 and llm.state.blocks.take_tier_moves() == ([], [])


@pytest.mark.parametrize("backend", ["native", "disk"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_the_tier_keeps_exactly_the_evicted_kv(model, backend, kv_cache_dtype):
    kept: dict[int, torch.Tensor] = {}

    def snapshot(llm, prompt):  # A's cached blocks as they are in the pool before B and C evict them
        blocks = llm.state.blocks
        for key in blocks.hash_blocks(prompt):
            kept[key] = read_block(llm.runner.cache, blocks._cached[key])

    llm = LLM(
        model,
        kv_offloading_size=tier_gib(model, 32, dtype=torch.float8_e4m3fn if kv_cache_dtype == "fp8" else torch.float32),
        kv_offloading_backend=backend,
        kv_cache_dtype=kv_cache_dtype,
        **POOL,
    )
    a, b, c = conversations(1)
    llm.generate([a], GREEDY, use_tqdm=False)
    snapshot(llm, a)
    llm.generate([b, c], GREEDY, use_tqdm=False)
    spilled = [key for key in kept if llm.kv_tier.holds(key)]
    assert spilled and all(key not in llm.state.blocks._cached for key in spilled)
    for key in spilled:
        data = llm.kv_tier.get(key)
        assert data.dtype == kept[key].dtype and torch.equal(data, kept[key])  # bitwise: fp8 as its bytes


@pytest.mark.parametrize("backend", ["native", "disk"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_a_returning_conversation_reloads_its_prefix_with_the_same_greedy_tokens(model, backend, kv_cache_dtype):
    dtype = torch.float8_e4m3fn if kv_cache_dtype == "fp8" else torch.float32
    plain, computed_plain = returning_conversation(LLM(model, kv_cache_dtype=kv_cache_dtype, **POOL))
    llm = LLM(
        model,
        kv_offloading_size=tier_gib(model, 32, dtype=dtype),
        kv_offloading_backend=backend,
        kv_cache_dtype=kv_cache_dtype,
        **POOL,
    )
    tiered, computed = returning_conversation(llm)
    stats = llm.describe()["kv_tier"]
    assert tiered == plain
    assert stats["reloaded"] > 0 and computed == computed_plain - stats["reloaded"] * POOL["block_size"]
    assert stats["capacity_blocks"] == 32 and stats["held_blocks"] <= 32 and stats["backend"] == backend


def test_a_tier_smaller_than_what_is_evicted_stays_bounded_and_counts_its_drops(model):
    llm = LLM(model, kv_offloading_size=tier_gib(model, 2), **POOL)
    tokens, _ = returning_conversation(llm)
    plain, _ = returning_conversation(LLM(model, **POOL))
    stats = llm.kv_tier.stats()
    assert tokens == plain and stats["held_blocks"] == 2 and stats["dropped"] == stats["spilled"] - 2 > 0


def test_the_default_model_reloads_a_returning_conversation_with_the_same_tokens(default_model):
    settings = dict(num_blocks=6, block_size=16, max_num_seqs=2, max_model_len=128)
    plain, computed_plain = returning_conversation(LLM(default_model, **settings), seed=3)
    llm = LLM(default_model, kv_offloading_size=tier_gib(default_model, 16, block_size=16), **settings)
    tiered, computed = returning_conversation(llm, seed=3)
    assert tiered == plain and llm.kv_tier.reloaded > 0 and computed < computed_plain


def test_a_reload_policy_decides_and_one_that_skips_the_pools_end_is_refused(model):
    def never(prompt_tokens, cached_tokens, tier_blocks, block_size):
        return []

    llm = LLM(model, kv_offloading_size=tier_gib(model, 32), reload_policy=never, **POOL)
    plain, computed_plain = returning_conversation(LLM(model, **POOL))
    assert returning_conversation(llm) == (plain, computed_plain) and llm.kv_tier.reloaded == 0

    def from_the_start(prompt_tokens, cached_tokens, tier_blocks, block_size):
        return list(range(tier_blocks))

    blocks = PrefixCachingBlockAllocator(4, 2)
    blocks.attach_tier(EveryBlock(), from_the_start)
    blocks.allocate("x", 2)
    blocks.cache_full_blocks("x", [1, 2])
    blocks.free("x")  # the pool keeps the first block; the tier (it says) the rest
    with pytest.raises(ValueError, match=r"from block 1 \(where the pool's run ended\)"):
        blocks.take_cached_prefix("y", [1, 2, 3, 4, 5])


class EveryBlock:
    """A tier that holds whatever is asked for (the allocator's side only: no data)."""

    def holds(self, key):
        return True

    def held_run(self, hashes):
        return len(hashes)


def test_an_evicted_block_whose_reload_never_ran_is_not_spilled():
    blocks = PrefixCachingBlockAllocator(2, 2)
    blocks.attach_tier(EveryBlock())
    assert blocks.take_cached_prefix("a", [1, 2, 3, 4]) == 4  # both blocks reloaded from the tier, pending
    blocks.free("a")  # it let go before any step ran: the blocks are named and evictable
    blocks.allocate("b", 4)  # evicts both before their reload ran
    assert blocks.take_tier_moves() == ([], [])


# --- the dials -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(kv_offloading_size=0), "number of GiB > 0"),
        (dict(kv_offloading_size=-1.0), "number of GiB > 0"),
        (dict(kv_offloading_size="4"), "number of GiB > 0"),
        (dict(kv_offloading_size=True), "number of GiB > 0"),
        (dict(kv_offloading_size=1, kv_offloading_backend="ssd"), "'native'.*or 'disk'"),
        (dict(kv_offloading_size=1, enable_prefix_caching=False), "needs prefix caching"),
    ],
)
def test_bad_dials_are_refused_by_name(settings, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**settings)


def test_a_tier_below_one_block_or_without_a_caching_allocator_is_refused(model):
    with pytest.raises(ValueError, match="holds no block: one block takes"):
        LLM(model, kv_offloading_size=tier_gib(model, 1) / 2, **POOL)
    with pytest.raises(ValueError, match="no tier is on"):
        LLM(model, reload_policy=lambda *args: [], **POOL)

    class LearnersCache(PrefixCachingBlockAllocator):
        attach_tier = None  # type: ignore[assignment]

    with pytest.raises(MissingPartError, match="kv offloading needs the block allocator to have attach_tier"):
        LLM(model, block_allocator=LearnersCache(12, 8), kv_offloading_size=1.0, max_model_len=128)
    with pytest.raises(ValueError, match="needs prefix caching"):
        LLM(model, block_allocator=FreeListBlockAllocator(12, 8), kv_offloading_size=1.0, max_model_len=128)


@pytest.mark.parametrize("size", ["0", "-2", "lots", "inf"])
def test_the_serve_flag_refuses_a_bad_size(size, capsys):
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-offloading-size", size])
    assert "--kv-offloading-size" in capsys.readouterr().err


def test_the_serve_flags_reach_the_engine_and_the_counters_reach_metrics(model):
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parser.parse_args(["--kv-offloading-size", "0.5", "--kv-offloading-backend", "disk"])
    dials = serve_cli.engine_dials(args)
    assert dials["kv_offloading_size"] == 0.5 and dials["kv_offloading_backend"] == "disk"
    assert "kv_offloading_size" not in serve_cli.engine_dials(parser.parse_args([]))
    llm = LLM(model, kv_offloading_size=tier_gib(model, 32), **POOL)
    returning_conversation(llm)
    metrics = ServerMetrics("tiny")
    metrics.watch_tier(llm.kv_tier, llm.config.block_size)
    text = metrics.render().decode()
    reloaded_tokens = llm.kv_tier.reloaded * POOL["block_size"]
    assert f'vllm:external_prefix_cache_hits_total{{engine="0",model_name="tiny"}} {reloaded_tokens:.1f}' in text
    assert f'labkit:kv_offload_blocks{{engine="0",model_name="tiny"}} {len(llm.kv_tier):.1f}' in text
