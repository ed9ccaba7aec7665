"""Speculative decoding on the cost model's clock: the simulator's steps and the planner's speed-up curve."""

from __future__ import annotations

import math

import pytest

from labkit.capacity import format_speculation, speculation_breakeven_batch, speculative_speedup
from labkit.metrics import summarize
from labkit.sim import CostModel, get_hardware, get_model
from labkit.sim.cost_model import expected_tokens_per_step
from labkit.sim.simulator import simulate
from labkit.workloads import RequestSpec, Workload


def test_expected_tokens_per_step_is_leviathans_formula():
    assert expected_tokens_per_step(4, 0.7) == pytest.approx((1 - 0.7**5) / 0.3)
    assert expected_tokens_per_step(3, 1.0) == 4 and expected_tokens_per_step(3, 0.0) == 1
    assert expected_tokens_per_step(0, 0.5) == 1


def test_speculation_pays_at_batch_one_and_slows_a_large_batch():
    small, large = speculative_speedup([1, 1024], k=4, acceptance_rate=0.7)
    assert small.speedup > 2 and small.verify_bound == "memory"
    assert large.speedup < 1 and large.verify_bound == "compute"
    assert not large.fits_in_memory  # the planner says when a batch is arithmetic only


def test_short_contexts_and_low_acceptance_stop_paying_at_a_smaller_batch():
    breakeven = speculation_breakeven_batch(context_len=300, acceptance_rate=0.5)
    assert breakeven is not None and 8 < breakeven < 256
    points = speculative_speedup([breakeven - 1, breakeven], context_len=300, acceptance_rate=0.5)
    assert points[0].speedup >= 1 > points[1].speedup
    assert speculation_breakeven_batch(context_len=300, acceptance_rate=0.9) > breakeven


def test_a_draft_model_costs_its_passes():
    free = speculative_speedup([1], k=4, acceptance_rate=0.8)[0]
    drafted = speculative_speedup([1], k=4, acceptance_rate=0.8, draft=get_model("smollm2-135m"))[0]
    assert drafted.speculative_step_s > free.speculative_step_s and drafted.speedup < free.speedup
    assert "speed-up" in format_speculation([free, drafted])


def workload(n=24, prompt=200, output=64):
    return Workload(tuple(RequestSpec(f"r{i}", 0.0, prompt, output) for i in range(n)), name="uniform")


def cost():
    return CostModel.from_parts(get_hardware("h100-sxm"), get_model("llama-3.1-8b"), overhead_s=0.001)


@pytest.mark.parametrize("rate", [0.0, 0.5, 0.9])
def test_simulated_acceptance_matches_the_rate_and_the_formula(rate):
    k = 4
    config = {"method": "ngram", "num_speculative_tokens": k, "acceptance_rate": rate}
    trace = simulate(workload(n=32, output=200), cost(), num_blocks=4000, speculative_config=config)
    s = summarize(trace)
    assert s.num_completed == 32 and s.total_output_tokens == 32 * 200  # never past max_tokens
    assert s.spec_decode_num_draft_tokens > 0
    if rate == 0:
        assert s.spec_decode_num_accepted_tokens == 0
    # drafts near the end of an answer are cut short, so the per-step gain sits a little below the formula
    assert s.spec_decode_mean_acceptance_length == pytest.approx(expected_tokens_per_step(k, rate), rel=0.08)
    assert "speculative_decoding" in trace.meta


def test_simulated_speculation_at_batch_one_is_faster_and_counts_1_plus_k_tokens_per_step():
    config = {"method": "ngram", "num_speculative_tokens": 4, "acceptance_rate": 0.8}
    plain = simulate(workload(n=1, output=300), cost(), num_blocks=4000)
    spec = simulate(workload(n=1, output=300), cost(), num_blocks=4000, speculative_config=config)
    assert summarize(spec).output_throughput > 2 * summarize(plain).output_throughput
    assert 5 in {n for step in spec.steps for n in step.scheduled.values()}


def test_simulated_speculation_slows_a_large_compute_bound_batch():
    config = {"method": "ngram", "num_speculative_tokens": 4, "acceptance_rate": 0.3}
    work = workload(n=256, prompt=50, output=100)
    plain = simulate(work, cost(), num_blocks=40000, max_num_seqs=256, max_num_batched_tokens=4096)
    spec = simulate(
        work, cost(), num_blocks=40000, max_num_seqs=256, max_num_batched_tokens=4096, speculative_config=config
    )
    assert summarize(spec).output_throughput < summarize(plain).output_throughput


def test_the_simulator_needs_an_acceptance_rate():
    with pytest.raises(ValueError, match="needs 'acceptance_rate'"):
        simulate(
            workload(n=1), cost(), num_blocks=100, speculative_config={"method": "ngram", "num_speculative_tokens": 2}
        )
    assert math.isnan(summarize(simulate(workload(n=2), cost(), num_blocks=100)).spec_decode_acceptance_rate)
