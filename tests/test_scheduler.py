"""Each scheduler policy's decisions on small hand-built cases: plain Python, no model."""

import pytest

from labkit.engine.request import Request, RequestStatus
from labkit.engine.scheduler import (
    ChunkedPrefill,
    ContinuousBatching,
    PolicyBase,
    SchedulerOutput,
    SchedulerState,
    StaticBatching,
    make_policy,
)
from labkit.kv.block_allocator import FreeListBlockAllocator
from labkit.sampling import SamplingParams


def make_state(num_blocks=16, block_size=4, max_num_seqs=4, budget=64, max_model_len=64):
    return SchedulerState(FreeListBlockAllocator(num_blocks, block_size), max_num_seqs, budget, max_model_len)


def add(state, request_id, prompt_len, max_tokens=4):
    request = Request(request_id, list(range(2, 2 + prompt_len)), SamplingParams(max_tokens=max_tokens))
    assert state.add(request)
    return request


def step(state, policy):
    """Plan a step, then play the model: advance progress, emit token 9, finish at max_tokens."""
    plan = policy.schedule(state)
    for request_id, num_new in plan.scheduled.items():
        request = state.requests[request_id]
        request.num_computed_tokens += num_new
        if request.num_missing_tokens == 0:
            request.append_token(9, state.now)
            if len(request.output_token_ids) >= request.params.max_tokens:
                state.finish(request, "length")
    state.now += 1
    return plan


def test_continuous_admits_fcfs_up_to_max_num_seqs_and_prefills_whole_prompts():
    state = make_state(max_num_seqs=2)
    for name, length in [("a", 5), ("b", 3), ("c", 2)]:
        add(state, name, length)
    plan = step(state, ContinuousBatching())
    assert plan.scheduled == {"a": 5, "b": 3}
    assert [r.request_id for r in state.waiting] == ["c"]
    assert step(state, ContinuousBatching()).scheduled == {"a": 1, "b": 1}  # decodes


def test_continuous_fills_a_freed_slot_the_next_step():
    state = make_state(max_num_seqs=2)
    add(state, "a", 4, max_tokens=1)
    add(state, "b", 4, max_tokens=3)
    add(state, "c", 4)
    policy = ContinuousBatching()
    step(state, policy)  # a and b prefill; a finishes at once
    assert state.requests.keys() == {"b", "c"}
    assert step(state, policy).scheduled == {"b": 1, "c": 4}


def test_continuous_stops_at_the_first_request_without_blocks():
    state = make_state(num_blocks=4, block_size=4)
    add(state, "a", 12)  # 3 blocks
    add(state, "b", 8)  # 2 blocks: does not fit
    add(state, "c", 2)  # would fit, but FCFS does not jump the queue
    assert step(state, ContinuousBatching()).scheduled == {"a": 12}
    assert state.blocks.num_used_blocks == 3


def test_continuous_without_chunking_waits_for_room_in_the_token_budget():
    state = make_state(budget=10)
    add(state, "a", 6)
    add(state, "b", 6)
    policy = ContinuousBatching()
    assert step(state, policy).scheduled == {"a": 6}
    assert step(state, policy).scheduled == {"a": 1, "b": 6}


def test_chunked_prefill_puts_decodes_first_and_chunks_prompts_into_the_rest():
    state = make_state(budget=8)
    add(state, "a", 3)
    policy = ChunkedPrefill()
    assert step(state, policy).scheduled == {"a": 3}
    add(state, "b", 13)
    add(state, "c", 4)
    assert step(state, policy).scheduled == {"a": 1, "b": 7}  # decode, then a 7-token chunk
    assert step(state, policy).scheduled == {"a": 1, "b": 6, "c": 1}
    plan = step(state, policy)
    assert plan.scheduled == {"a": 1, "b": 1, "c": 3}  # b now decodes, c finishes its prompt
    assert all(r.is_decoding for r in state.running)


def test_static_batch_runs_until_its_longest_member_ends_and_holds_its_slots():
    state = make_state(max_num_seqs=2)
    add(state, "short", 3, max_tokens=1)
    add(state, "long", 3, max_tokens=3)
    policy = StaticBatching()
    first = step(state, policy)
    assert first.scheduled == {"short": 3, "long": 3} and first.slots_held == 2
    add(state, "late", 2)
    second = step(state, policy)
    assert second.scheduled == {"long": 1} and second.slots_held == 2  # "short" ended but holds its slot
    assert step(state, policy).scheduled == {"long": 1}  # "late" waits for the batch
    nxt = step(state, policy)
    assert nxt.scheduled == {"late": 2} and nxt.slots_held == 1


def test_preemption_frees_the_newest_and_puts_it_first_in_line():
    state = make_state(num_blocks=3, block_size=4)
    old = add(state, "old", 4, max_tokens=8)
    new = add(state, "new", 4, max_tokens=8)
    policy = ContinuousBatching()
    assert step(state, policy).scheduled == {"old": 4, "new": 4}  # one block each, one left
    plan = step(state, policy)  # both need a fifth slot: "old" gets the last block
    assert plan.preempted == ["new"] and plan.scheduled == {"old": 1}
    assert new.status is RequestStatus.WAITING and new.num_computed_tokens == 0 and new.num_preemptions == 1
    assert state.waiting[0] is new and state.num_preemptions == 1
    assert old.status is RequestStatus.RUNNING and state.blocks.block_table("new") == []


def test_preempted_request_recomputes_prompt_and_output_then_decodes():
    state = make_state(num_blocks=2, block_size=4)
    a = add(state, "a", 4, max_tokens=3)
    b = add(state, "b", 4, max_tokens=3)
    policy = ContinuousBatching()
    step(state, policy)  # both prefill, one token each, pool full
    plan = step(state, policy)  # a's decode needs a block: b (newest) goes
    assert plan.preempted == ["b"] and plan.scheduled == {"a": 1}
    assert b.num_missing_tokens == 5  # 4 prompt tokens + 1 output token to recompute
    while a.status is not RequestStatus.FINISHED:
        step(state, policy)
    assert policy.schedule(state).scheduled == {"b": 5}
    assert b.split_new_tokens(5) == (5, 0)  # the recompute counts as prefill
    b.num_computed_tokens += 5
    b.append_token(9, state.now)
    assert b.is_decoding and b.split_new_tokens(1) == (0, 1)


def test_no_admission_in_a_step_that_preempted():
    state = make_state(num_blocks=3, block_size=4)
    for name, length in [("a", 4), ("b", 4), ("c", 1)]:
        add(state, name, length, max_tokens=6)
    policy = ContinuousBatching()
    step(state, policy)  # three blocks taken
    plan = step(state, policy)  # a takes c's block, b must preempt itself
    assert plan.preempted == ["c", "b"] and plan.scheduled == {"a": 1}
    assert [r.request_id for r in state.waiting] == ["b", "c"]
    assert state.blocks.num_free_blocks == 1  # room for c, yet nobody joins in this step


@pytest.mark.parametrize("prompt_len, max_tokens, why", [(64, 4, "max_model_len"), (30, 40, "whole cache")])
def test_requests_that_can_never_fit_are_rejected_with_a_reason(prompt_len, max_tokens, why):
    state = make_state(num_blocks=8, block_size=4)  # 32 token slots
    request = Request("x", [3] * prompt_len, SamplingParams(max_tokens=max_tokens))
    assert not state.add(request)
    assert request.finish_reason == "rejected" and why in request.message
    assert not state.waiting


def test_a_learners_policy_plugs_in_through_one_method():
    class ShortestFirst(PolicyBase):
        name = "shortest-first"

        def schedule(self, state):
            output = SchedulerOutput()
            for request in list(state.running):
                if state.reserve(request, 1, output):
                    output.scheduled[request.request_id] = 1
            queue = sorted(state.waiting, key=lambda r: r.num_tokens)
            state.waiting.clear()
            state.waiting.extend(queue)
            if state.waiting and not state.running:
                request = state.waiting[0]
                state.admit(request, request.num_tokens)
                output.scheduled[request.request_id] = request.num_tokens
            return output

    state = make_state()
    add(state, "long", 9)
    add(state, "short", 2)
    assert step(state, make_policy(ShortestFirst())).scheduled == {"short": 2}


def test_policies_by_name():
    assert isinstance(make_policy("chunked"), ChunkedPrefill)
    with pytest.raises(ValueError, match="unknown scheduler policy"):
        make_policy("fastest")
