"""The prefix-caching block allocator, alone and under the engine's scheduler with no model.

The randomized runs use a fake KV pool: each step writes every new token's id into its slot
and first checks that every slot a request reads (through its block table) holds the
request's own token there, so a block shared by mistake, or evicted while in use, is caught
at the step it would corrupt.
"""

import random

import pytest

from labkit.engine.core import EngineCore
from labkit.engine.request import Request
from labkit.engine.scheduler import SchedulerState, make_policy
from labkit.kv.block_allocator import FreeListBlockAllocator, OutOfBlocksError
from labkit.kv.prefix_cache import NO_PARENT, PrefixCachingBlockAllocator, block_hash
from labkit.sampling_params import SamplingParams

B = 4  # block size


def cached(allocator, seq, tokens):
    """Allocate a sequence for ``tokens`` and name its full blocks, as a step that computed them would."""
    allocator.allocate(seq, len(tokens))
    allocator.cache_full_blocks(seq, tokens)


def test_a_second_sequence_takes_the_full_blocks_it_shares_and_holds_them():
    blocks = PrefixCachingBlockAllocator(8, B)
    cached(blocks, "a", list(range(10)))  # blocks of 0-3 and 4-7 are full; 8-9 is partial
    assert blocks.take_cached_prefix("b", list(range(9))) == 8
    assert blocks.block_table("b") == []  # held, not yet in the table
    assert blocks.num_new_blocks("b", 1) == 1  # so a policy counts only the blocks for its new tokens
    table = blocks.allocate("b", 8 + 1)
    assert table[:2] == blocks.block_table("a")[:2] and table[2] != blocks.block_table("a")[2]
    assert [blocks.ref_count(b) for b in table] == [2, 2, 1]
    assert blocks.num_used_blocks == 4


def test_the_last_partial_block_is_never_found():
    blocks = PrefixCachingBlockAllocator(8, B)
    cached(blocks, "a", list(range(6)))
    assert blocks.num_cached_blocks == 1
    assert blocks.take_cached_prefix("b", list(range(6))) == 4


def test_the_same_block_after_another_parent_never_matches():
    blocks = PrefixCachingBlockAllocator(8, B)
    cached(blocks, "a", [1, 2, 3, 4, 5, 6, 7, 8])
    assert blocks.take_cached_prefix("b", [9, 9, 9, 9, 5, 6, 7, 8]) == 0  # block 2's tokens, another parent
    assert blocks.take_cached_prefix("c", [5, 6, 7, 8]) == 0  # same tokens, first position
    assert blocks.take_cached_prefix("d", [1, 2, 3, 4, 5, 6, 7, 8, 0]) == 8
    assert block_hash(NO_PARENT, [5, 6, 7, 8]) != block_hash(block_hash(NO_PARENT, [1, 2, 3, 4]), [5, 6, 7, 8])


def test_a_hash_collision_is_caught_by_comparing_the_tokens(monkeypatch):
    blocks = PrefixCachingBlockAllocator(8, B)
    monkeypatch.setattr("labkit.kv.prefix_cache.block_hash", lambda parent, tokens: 42)  # every block collides
    cached(blocks, "a", [1, 2, 3, 4])
    assert blocks.take_cached_prefix("b", [5, 6, 7, 8, 0]) == 0
    assert blocks.take_cached_prefix("c", [1, 2, 3, 4, 0]) == 4


def test_a_shared_block_is_freed_only_when_the_last_sequence_lets_go():
    blocks = PrefixCachingBlockAllocator(4, B)
    cached(blocks, "a", list(range(8)))
    blocks.take_cached_prefix("b", list(range(8)))
    blocks.allocate("b", 8)
    blocks.free("a")
    assert blocks.num_free_blocks == 2 and blocks.num_used_blocks == 2
    blocks.free("b")
    assert blocks.num_free_blocks == 4 and blocks.num_cached_blocks == 2  # free, yet still findable
    with pytest.raises(ValueError, match="double free"):
        blocks.free_block(0)


def test_allocation_takes_unused_blocks_first_then_evicts_the_least_recently_freed():
    blocks = PrefixCachingBlockAllocator(4, B)
    cached(blocks, "old", [1, 1, 1, 1])
    cached(blocks, "new", [2, 2, 2, 2])
    blocks.free("old")
    blocks.free("new")  # freed last: evicted last
    blocks.allocate("x", 2 * B)  # the two never-used blocks
    assert blocks.num_evictions == 0 and blocks.num_cached_blocks == 2
    blocks.allocate("y", B)
    assert blocks.num_evictions == 1
    assert blocks.take_cached_prefix("p", [1, 1, 1, 1, 0]) == 0  # the older one left the map
    assert blocks.take_cached_prefix("q", [2, 2, 2, 2, 0]) == B
    with pytest.raises(OutOfBlocksError):
        blocks.allocate("z", B)  # the last cached block is held by q: not free


def test_a_sequence_frees_its_tail_first_so_the_shared_head_stays_longest():
    blocks = PrefixCachingBlockAllocator(3, B)
    cached(blocks, "a", list(range(12)))
    blocks.free("a")
    blocks.allocate("x", B)  # evicts the last block of a's prefix, not the first
    assert blocks.take_cached_prefix("b", list(range(12))) == 2 * B


def test_a_held_prefix_is_let_go_by_free_and_a_second_lookup_is_refused():
    blocks = PrefixCachingBlockAllocator(4, B)
    cached(blocks, "a", list(range(8)))
    blocks.free("a")
    blocks.take_cached_prefix("b", list(range(9)))
    assert blocks.num_free_blocks == 2
    with pytest.raises(ValueError, match="already holds blocks"):
        blocks.take_cached_prefix("b", list(range(9)))
    blocks.free("b")
    assert blocks.num_free_blocks == 4


def test_prefix_caching_with_a_plain_allocator_is_refused_by_name():
    with pytest.raises(TypeError, match="FreeListBlockAllocator lacks them.*lab 7.*or turn prefix caching off"):
        SchedulerState(FreeListBlockAllocator(8, B), 4, 64, 64, enable_prefix_caching=True)
    SchedulerState(PrefixCachingBlockAllocator(8, B), 4, 64, 64, enable_prefix_caching=True)


# --- randomized runs under the scheduler ---------------------------------------------------------


def content_token(tokens: list[int]) -> int:
    """The fake model's next token: a function of the whole sequence, so any schedule must give the same."""
    return hash(tuple(tokens)) % 5


class FakeModel:
    """An executor over a fake KV pool (slot -> token id) that checks every slot a request reads."""

    def __init__(self, state: SchedulerState):
        self.state = state
        self.slots: dict[int, int] = {}

    def __call__(self, batch, start):
        blocks = self.state.blocks
        for request, num_new in batch.work:
            table, tokens = blocks.block_table(request.request_id), request.all_token_ids
            end = request.num_computed_tokens + num_new
            assert len(table) * B >= end, "a step must have blocks for every token it writes"
            for pos in range(end):
                slot = table[pos // B] * B + pos % B
                if pos >= request.num_computed_tokens:
                    self.slots[slot] = tokens[pos]
                assert self.slots.get(slot) == tokens[pos], f"{request.request_id} reads a wrong K/V at {pos}"
        return {
            r.request_id: content_token(r.all_token_ids) for r, _ in batch.work if r.request_id in batch.samplers
        }, start + 1.0


def check_invariants(state: SchedulerState) -> None:
    blocks = state.blocks
    refs = [0] * blocks.num_blocks
    owners = {**blocks._tables, **blocks._held}
    for table in owners.values():
        for block in table:
            refs[block] += 1
    assert refs == blocks._refs, "ref counts must equal the tables and held prefixes that hold each block"
    free, evictable = set(blocks._free), set(blocks._evictable)
    assert len(free) == len(blocks._free) and not free & evictable
    for block in range(blocks.num_blocks):
        assert (refs[block] == 0) == (block in free or block in evictable), f"block {block} is lost or both"
    for key, block in blocks._cached.items():
        parent, tokens = blocks._content[block]
        assert blocks._hash_of[block] == key == block_hash(parent, tokens)
    for request in state.running:  # every named block a request reads holds its tokens after its parents
        table, parent = blocks.block_table(request.request_id), NO_PARENT
        for index in range(request.num_computed_tokens // B):
            tokens = tuple(request.all_token_ids[index * B : (index + 1) * B])
            if blocks._hash_of[table[index]] is not None:
                assert blocks._content[table[index]] == (parent, tokens)
            parent = block_hash(parent, tokens)


def random_run(seed: int, caching: bool, check: bool = True):
    """Requests in three prompt families on a small pool, random aborts; returns outputs and the state.

    ``check``: the allocator's invariants after every step (the fake model's checks always run).
    """
    r = random.Random(seed)
    num_blocks = r.randint(12, 24)
    allocator = PrefixCachingBlockAllocator if caching else FreeListBlockAllocator
    state = SchedulerState(
        allocator(num_blocks, B),
        max_num_seqs=r.randint(2, 6),
        max_num_batched_tokens=r.choice([8, 16, 64]),
        max_model_len=48,
        enable_prefix_caching=caching,
    )
    policy = make_policy(r.choice(["continuous", "chunked"]) if state.max_num_batched_tokens >= 48 else "chunked")
    core = EngineCore(policy, state, eos_token_ids=[])
    families = [[r.randint(0, 4) for _ in range(24)] for _ in range(3)]
    requests = []
    for i in range(r.randint(8, 20)):
        prompt = r.choice(families)[: r.randint(1, 24)] + [r.randint(0, 4) for _ in range(r.randint(0, 8))]
        request = Request(
            f"r{i}",
            prompt or [1],
            SamplingParams(max_tokens=r.randint(1, 16), ignore_eos=True),
            float(r.randint(0, 10)),
        )
        requests.append(request)
        core.add(request)
    model, now, aborted = FakeModel(state), 0.0, set()
    while core.has_unfinished():
        if r.random() < 0.03:
            victim = r.choice(requests)
            if core.abort(victim.request_id):
                aborted.add(victim.request_id)
        outcome = core.step(now, model)
        now = outcome.record.end if outcome.record else now + 1.0
        if caching and check:
            check_invariants(state)
    outputs = {req.request_id: req.output_token_ids for req in requests if req.request_id not in aborted}
    return outputs, state, core.trace


@pytest.mark.parametrize("seed", range(60))
def test_random_runs_keep_every_block_accounted_for_and_give_the_same_tokens(seed):
    outputs, state, trace = random_run(seed, caching=True)
    plain_outputs, _, _ = random_run(seed, caching=False)
    both = outputs.keys() & plain_outputs.keys()  # aborts land at other moments of the two schedules
    assert len(both) >= len(outputs) // 2 and all(outputs[k] == plain_outputs[k] for k in both)
    assert state.blocks.num_free_blocks == state.blocks.num_blocks and not any(state.blocks._refs)
    assert sum(step.prefix_cache_hits for step in trace.steps) <= sum(step.prefix_cache_queries for step in trace.steps)


def test_random_runs_do_hit_evict_and_preempt():
    """The randomized runs above exercise what they claim to."""
    totals = dict(hits=0, evictions=0, preemptions=0)
    for seed in range(60):
        _, state, trace = random_run(seed, caching=True)
        totals["hits"] += sum(step.prefix_cache_hits for step in trace.steps)
        totals["evictions"] += state.blocks.num_evictions
        totals["preemptions"] += state.num_preemptions
    assert all(totals.values()), totals


def test_both_checks_catch_a_shared_block_freed_while_another_request_reads_it(monkeypatch):
    """Neither check is vacuous: freeing a shared block at the first release (ignoring the other
    holders) fails the invariants and, with those off, the fake model's reads."""
    original = PrefixCachingBlockAllocator.free_block

    def frees_at_once(self, block):
        if self._refs[block] > 1:
            self._refs[block] = 1
        original(self, block)

    monkeypatch.setattr(PrefixCachingBlockAllocator, "free_block", frees_at_once)
    with pytest.raises(AssertionError, match="ref counts"):
        for seed in range(60):
            random_run(seed, caching=True)
    with pytest.raises(AssertionError, match="reads a wrong K/V"):
        for seed in range(60):
            random_run(seed, caching=True, check=False)


def test_a_preempted_request_finds_its_own_blocks_again_when_readmitted():
    state = SchedulerState(
        PrefixCachingBlockAllocator(8, B),
        max_num_seqs=2,
        max_num_batched_tokens=64,
        max_model_len=32,
        enable_prefix_caching=True,
    )
    core = EngineCore(make_policy("continuous"), state, eos_token_ids=[])
    request = Request("a", list(range(10)), SamplingParams(max_tokens=8, ignore_eos=True))
    core.add(request)
    model = FakeModel(state)
    core.step(0.0, model)  # prefill 10 tokens: two full blocks are named
    state.preempt(request)
    assert request.num_computed_tokens == 0 and state.blocks.num_used_blocks == 0
    record = core.step(1.0, model).record
    assert record.prefix_cache_hits == 8 and record.prefix_cache_queries == 11
    assert record.scheduled == {"a": 3}  # 11 tokens, 8 found: the rest and the sampled token computed
