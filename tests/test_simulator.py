"""The simulator drives the engine's schedulers on the cost model's clock: its invariants."""

import json

import numpy as np
import pytest

from labkit.capacity import LESSON_LLAMA_8B, SALE_GPU
from labkit.engine.scheduler import PolicyBase, SchedulerOutput
from labkit.metrics import summarize
from labkit.sim import MODELS, CostModel
from labkit.sim.simulator import blocks_that_fit, simulate
from labkit.workloads import replay_workload, sale_workload

COST = CostModel.from_parts(SALE_GPU, LESSON_LLAMA_8B, overhead_s=0.003)
BLOCKS = blocks_that_fit(SALE_GPU, LESSON_LLAMA_8B)


def all_at_once(prompt_lens, output_lens):
    return replay_workload([0.0] * len(prompt_lens), prompt_lens, output_lens)


def test_static_padding_is_the_sum_of_batch_max_minus_own_length():
    outputs = [3, 10, 1, 7, 5, 5, 12, 2, 9, 4]
    workload = all_at_once([20 + i for i in range(len(outputs))], outputs)
    trace = simulate(workload, COST, "static", num_blocks=BLOCKS, max_num_seqs=4)
    batches = [outputs[i : i + 4] for i in range(0, len(outputs), 4)]  # first come, first served
    expected = sum(max(batch) - own for batch in batches for own in batch)
    assert summarize(trace).padded_slot_steps == expected
    assert sum(step.slots_held - step.num_active for step in trace.steps) == expected


def test_continuous_batching_uses_slots_at_least_as_well_as_static():
    workload = sale_workload(150, rate=20.0, seed=1)
    static = summarize(simulate(workload, COST, "static", num_blocks=BLOCKS, max_num_seqs=16))
    continuous = summarize(simulate(workload, COST, "continuous", num_blocks=BLOCKS, max_num_seqs=16))
    assert continuous.slot_utilization >= static.slot_utilization
    assert continuous.padded_slot_steps == 0 < static.padded_slot_steps
    assert continuous.ttft_ms.median < static.ttft_ms.median


@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
def test_every_request_gets_exactly_its_answer_length(policy):
    workload = sale_workload(60, rate=30.0, seed=2)
    trace = simulate(workload, COST, policy, num_blocks=BLOCKS, max_num_seqs=8)
    by_id = {record.request_id: record for record in trace.requests}
    for spec in workload:
        record = by_id[spec.request_id]
        assert record.finish_reason == "length" and record.output_len == spec.output_len
        assert record.first_scheduled_time >= spec.arrival_time
        assert np.all(np.diff([spec.arrival_time, *record.token_times]) > 0)
    starts = [step.start for step in trace.steps]
    assert all(step.end > step.start for step in trace.steps) and starts == sorted(starts)


def test_a_lone_request_moves_at_the_cost_models_pace():
    trace = simulate(all_at_once([500], [4]), COST, "continuous", num_blocks=BLOCKS)
    times = trace.requests[0].token_times
    assert times[0] == pytest.approx(COST.prefill_time(500))  # TTFT: the prefill, no queue
    gaps = np.diff(times)
    expected = [COST.pass_time(1, 500 + i) for i in range(3)]  # each decode reads one more token
    assert gaps == pytest.approx(expected)


def test_chunked_prefill_removes_the_stall_a_long_prompt_causes():
    # Eight short chats decoding, then a 4,000-token document arrives.
    workload = replay_workload([0.0] * 8 + [0.05], [50] * 8 + [4000], [200] * 8 + [5])
    worst_gap = {}
    for policy, budget in (("continuous", 4096), ("chunked", 512)):  # room for the whole prompt, or chunks
        trace = simulate(workload, COST, policy, num_blocks=BLOCKS, max_num_batched_tokens=budget)
        worst_gap[policy] = max(np.diff(r.token_times).max() for r in trace.requests[:8])
    assert worst_gap["continuous"] > COST.prefill_time(4000)  # everyone froze for the whole prefill
    assert worst_gap["chunked"] < worst_gap["continuous"] / 3


def test_short_of_blocks_it_preempts_and_still_finishes_everyone():
    workload = all_at_once([64] * 6, [100] * 6)
    trace = simulate(workload, COST, "continuous", num_blocks=40, block_size=16)
    summary = summarize(trace)
    assert summary.num_preemptions > 0
    assert summary.num_completed == 6 and summary.total_output_tokens == 600
    assert all(step.blocks_used <= step.blocks_total for step in trace.steps)


def test_a_request_that_can_never_fit_is_rejected_not_lost():
    workload = all_at_once([30, 3000], [5, 5])
    trace = simulate(workload, COST, "continuous", num_blocks=BLOCKS, max_model_len=1000)
    assert [r.finish_reason for r in trace.requests] == ["length", "rejected"]


def test_a_rejected_last_request_ends_the_run_with_every_request_accounted_for():
    trace = simulate(replay_workload([0.0, 1.0], [20, 600], [12, 12]), COST, num_blocks=256, max_model_len=512)
    reasons = [record.finish_reason for record in trace.requests]
    assert reasons[0] in ("length", "stop") and reasons[1] == "rejected"


def test_the_trace_is_the_engines_format(tmp_path):
    trace = simulate(sale_workload(20, seed=4), COST, "chunked", num_blocks=BLOCKS)
    path = tmp_path / "sim.json"
    trace.to_json(path)
    loaded = json.loads(path.read_text())
    assert loaded["meta"]["simulated"] is True and loaded["meta"]["policy"] == "chunked"
    assert summarize(trace).num_completed == 20


def test_a_policy_that_schedules_nothing_is_reported():
    class Idle(PolicyBase):
        name = "idle"

        def schedule(self, state):
            return SchedulerOutput()

    with pytest.raises(RuntimeError, match="scheduled nothing"):
        simulate(all_at_once([10], [2]), COST, Idle(), num_blocks=BLOCKS)


def test_blocks_that_fit_is_the_planners_division():
    assert BLOCKS == (72e9 - 16e9) // (16 * 128 * 1024)
    with pytest.raises(ValueError, match="do not fit"):
        blocks_that_fit(SALE_GPU, MODELS["llama-3.1-8b"].__class__("huge", 70e9, 80, 8, 128))


@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
def test_engine_and_simulator_decide_alike_given_the_same_step_times(policy):
    """The real engine on the tiny model, its clock moved by the cost model, schedules as the simulator does."""
    from labkit.engine import LLM
    from labkit.models import tiny_model
    from labkit.sampling import SamplingParams

    rng = np.random.default_rng(5)
    prompt_lens = rng.integers(3, 50, size=12).tolist()
    output_lens = rng.integers(1, 30, size=12).tolist()
    arrivals = [0.002 * i for i in range(12)]  # steps take 11 ms or more, so the engine is never idle
    # 80 token slots for four sequences: every policy preempts; chunked prefill cuts prompts at 32.
    dials = dict(
        num_blocks=10,
        block_size=8,
        max_num_seqs=4,
        max_model_len=128,
        max_num_batched_tokens=32 if policy == "chunked" else 128,
    )

    now = [0.0]
    engine = LLM(tiny_model(), policy=policy, clock=lambda: now[0], **dials)
    run_pass = engine.runner.execute

    def execute_on_cost_clock(batch, blocks):
        now[0] += COST.pass_time(batch.num_tokens, batch.context_tokens)
        return run_pass(batch, blocks)

    engine.runner.execute = execute_on_cost_clock
    prompts = [rng.integers(2, 256, size=n).tolist() for n in prompt_lens]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in output_lens]
    engine.generate(prompts, params, arrival_times=arrivals, use_tqdm=False)
    simulated = simulate(replay_workload(arrivals, prompt_lens, output_lens), COST, policy, **dials)

    def decisions(trace, prefix):
        return [
            (
                {rid.removeprefix(prefix): n for rid, n in s.scheduled.items()},
                s.slots_held,
                [rid.removeprefix(prefix) for rid in s.preempted],
                s.start,
                s.end,
            )
            for s in trace.steps
        ]

    assert decisions(engine.trace, "") == decisions(simulated, "req-")
    assert summarize(simulated).num_preemptions == summarize(engine.trace).num_preemptions > 0
