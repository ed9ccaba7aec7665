"""Calibration: the fit recovers a known cost model, the saved fit round-trips, the report's errors add up."""

import math

import numpy as np
import pytest

from labkit.metrics import summarize
from labkit.sim import calibrate
from labkit.sim.calibrate import (
    Calibration,
    Comparison,
    NoBoundStepsError,
    StepWork,
    check_prediction,
    compare,
    fit_cost_model,
    format_report,
    load_calibration,
    step_work,
    time_engine_steps,
)
from labkit.sim.cost_model import CostModel
from labkit.sim.simulator import simulate
from labkit.workloads import replay_workload

SIZES = dict(weight_bytes=5.4e8, kv_bytes_per_token=46_080.0, flops_per_token=2.7e8)
TRUE = CostModel(bandwidth=12e9, flops=90e9, overhead_s=0.008, **SIZES)


def synthetic_steps(cost: CostModel, noise: float = 0.0, seed: int = 0) -> StepWork:
    """Step times from ``cost`` over a grid of batch sizes and contexts, with relative noise."""
    rng = np.random.default_rng(seed)
    new = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512] * 6)
    context = rng.integers(0, 4000, size=len(new))
    seconds = np.array([cost.pass_time(int(n), int(c)) for n, c in zip(new, context)])
    return StepWork(new, context, seconds * (1 + noise * rng.standard_normal(len(new))))


def test_fit_recovers_the_constants_that_made_the_step_times():
    fitted = fit_cost_model(synthetic_steps(TRUE), **SIZES)
    assert fitted.bandwidth == pytest.approx(TRUE.bandwidth, rel=1e-6)
    assert fitted.flops == pytest.approx(TRUE.flops, rel=1e-6)
    assert fitted.overhead_s == pytest.approx(TRUE.overhead_s, rel=1e-6)


def test_fit_stays_close_under_noise():
    fitted = fit_cost_model(synthetic_steps(TRUE, noise=0.03, seed=4), **SIZES)
    assert fitted.bandwidth == pytest.approx(TRUE.bandwidth, rel=0.1)
    assert fitted.flops == pytest.approx(TRUE.flops, rel=0.1)
    for new, context in ((1, 100), (8, 2000), (64, 500), (512, 0)):  # the overhead trades off with bandwidth
        assert fitted.pass_time(new, context) == pytest.approx(TRUE.pass_time(new, context), rel=0.05)


def test_fit_ignores_a_step_that_another_process_slowed_down():
    steps = synthetic_steps(TRUE)
    seconds = steps.seconds.copy()
    seconds[5] *= 6  # the OS gave the CPU away during this step
    fitted = fit_cost_model(StepWork(steps.new_tokens, steps.context_tokens, seconds), **SIZES)
    assert fitted.flops == pytest.approx(TRUE.flops, rel=1e-6)


def test_too_few_steps_is_a_clear_error():
    few = synthetic_steps(TRUE)
    few = StepWork(few.new_tokens[:3], few.context_tokens[:3], few.seconds[:3])
    with pytest.raises(ValueError, match="at least 8"):
        fit_cost_model(few, **SIZES)


def test_steps_of_one_kind_only_cannot_fit_both_rates():
    decode_only = np.ones(20, dtype=np.int64)
    context = np.arange(20) * 100
    seconds = np.array([TRUE.pass_time(1, int(c)) for c in context])
    for bandwidth in (None, TRUE.bandwidth):  # a probed bandwidth cannot help: the FLOPs never vary
        with pytest.raises(NoBoundStepsError, match="every timed step has 1 new tokens.*compute-bound") as caught:
            fit_cost_model(StepWork(decode_only, context, seconds), **SIZES, bandwidth=bandwidth)
        assert caught.value.limit == "compute"


def test_step_work_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="one new-token count"):
        StepWork(np.array([1, 2]), np.array([0]), np.array([0.1, 0.2]))


def test_step_work_rebuilds_each_steps_context_from_the_trace():
    workload = replay_workload([0.0, 0.0], [30, 10], [3, 2])
    trace = simulate(workload, TRUE, "chunked", num_blocks=64, max_num_batched_tokens=16)
    work = step_work(trace)
    # Each step reads every token its requests computed in the steps before it.
    computed: dict[str, int] = {}
    for step, context in zip(trace.steps, work.context_tokens.tolist()):
        assert context == sum(computed.get(request_id, 0) for request_id in step.scheduled)
        for request_id, num_new in step.scheduled.items():
            computed[request_id] = computed.get(request_id, 0) + num_new
    assert work.new_tokens.tolist() == [sum(step.scheduled.values()) for step in trace.steps]
    assert work.context_tokens.tolist()[:2] == [0, 16]  # the second chunk of the 30-token prompt reads the first
    expected = [TRUE.pass_time(int(n), int(c)) for n, c in zip(work.new_tokens, work.context_tokens)]
    assert work.seconds == pytest.approx(expected)


def test_a_calibration_saves_and_loads_back(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    calibration = Calibration(
        machine="box 1",
        device="cpu",
        model="SmolLM2",
        dtype="float32",
        cost=vars(TRUE),
        num_steps=60,
        median_step_error_pct=3.5,
    )
    path = calibration.save()
    assert path.is_relative_to(tmp_path) and "box_1" in path.name and "float32" in path.name
    loaded = load_calibration(path)
    assert loaded == calibration and loaded.cost_model == TRUE


def test_loading_a_missing_or_broken_calibration_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="labkit calibrate"):
        load_calibration(tmp_path / "none.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"machine": "x"}')
    with pytest.raises(ValueError, match="labkit calibrate"):
        load_calibration(broken)


def test_report_errors_are_predicted_minus_measured_over_measured():
    row = Comparison("median TPOT", "ms", predicted=55.0, measured=50.0)
    assert row.error_pct == pytest.approx(10.0)
    assert Comparison("x", "ms", 45.0, 50.0).error_pct == pytest.approx(-10.0)
    assert math.isnan(Comparison("x", "ms", 1.0, 0.0).error_pct)
    text = format_report([row])
    assert "+10.0%" in text and "55.0" in text and "50.0" in text


def test_a_simulation_compared_with_itself_has_no_error():
    workload = replay_workload([0.0, 0.1, 0.3], [40, 20, 60], [5, 8, 3])
    summary = summarize(simulate(workload, TRUE, "chunked", num_blocks=64))
    rows = compare(summary, summary)
    assert [row.name for row in rows] == ["output throughput", "median TTFT", "median TPOT"]
    assert all(row.error_pct == 0 for row in rows)


def test_a_short_sweep_and_check_on_the_tiny_model_run_end_to_end():
    from labkit.engine import LLM
    from labkit.models import tiny_model
    from labkit.workloads import synthetic_workload

    llm = LLM(tiny_model(), max_num_seqs=8, max_model_len=256, num_blocks=128)
    work = time_engine_steps(llm, waves=((1, 40), (4, 24)))
    assert len(work) > 10 and work.new_tokens.min() == 1 and work.new_tokens.max() >= 40
    assert work.context_tokens.max() > 40  # decodes read their prompt and earlier answer tokens
    workload = synthetic_workload(6, 100.0, 20, 5, vocab_size=256, seed=7)
    rows, simulated, measured = check_prediction(llm, TRUE, workload)
    assert len(simulated.requests) == len(measured.requests) == 6
    assert summarize(simulated).total_output_tokens == summarize(measured).total_output_tokens == 30
    assert all(math.isfinite(row.error_pct) for row in rows)


def test_step_work_starts_a_preempted_request_from_zero_again():
    workload = replay_workload([0.0] * 6, [64] * 6, [100] * 6)
    trace = simulate(workload, TRUE, "continuous", num_blocks=40, block_size=16)
    assert any(step.preempted for step in trace.steps)
    work = step_work(trace)  # the simulator timed each step from the context it really read
    expected = [TRUE.pass_time(int(n), int(c)) for n, c in zip(work.new_tokens, work.context_tokens)]
    assert work.seconds == pytest.approx(expected)


def test_a_machine_with_no_memory_bound_step_is_fitted_with_a_probed_bandwidth():
    slow_arithmetic = CostModel(bandwidth=40e9, flops=5e9, overhead_s=0.02, **SIZES)  # a CPU: compute everywhere
    steps = synthetic_steps(slow_arithmetic)
    assert all(
        slow_arithmetic.pass_breakdown(int(n), int(c)).bound == "compute"
        for n, c in zip(steps.new_tokens, steps.context_tokens)
    )
    with pytest.raises(NoBoundStepsError, match="memory-bound") as caught:
        fit_cost_model(steps, **SIZES)
    assert caught.value.limit == "memory"
    fitted = fit_cost_model(steps, **SIZES, bandwidth=40e9)
    assert fitted.bandwidth == 40e9
    assert fitted.flops == pytest.approx(slow_arithmetic.flops, rel=1e-6)
    assert fitted.overhead_s == pytest.approx(slow_arithmetic.overhead_s, rel=1e-6)


def test_a_probed_bandwidth_still_lets_the_memory_bound_steps_count():
    fitted = fit_cost_model(synthetic_steps(TRUE), **SIZES, bandwidth=TRUE.bandwidth)
    assert fitted.flops == pytest.approx(TRUE.flops, rel=1e-6)
    assert fitted.overhead_s == pytest.approx(TRUE.overhead_s, rel=1e-6)
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        fit_cost_model(synthetic_steps(TRUE), **SIZES, bandwidth=0.0)


def test_calibrating_a_machine_with_no_memory_bound_step_probes_the_bandwidth(monkeypatch):
    from labkit.engine import LLM
    from labkit.models import tiny_model

    llm = LLM(tiny_model(), max_num_seqs=8, max_model_len=256, num_blocks=128)
    monkeypatch.setattr(calibrate, "time_engine_steps", lambda llm, seed: synthetic_steps(TRUE))
    calls = []

    def fit_without_memory_bound_steps(work, bandwidth=None, **sizes):
        calls.append(bandwidth)
        if bandwidth is None:
            raise NoBoundStepsError("no memory-bound steps", limit="memory")
        return CostModel(bandwidth=bandwidth, flops=1e9, overhead_s=0.01, **sizes)

    monkeypatch.setattr(calibrate, "fit_cost_model", fit_without_memory_bound_steps)
    monkeypatch.setattr("labkit.sim.hardware.measure_bandwidth", lambda device=None: 7e9)
    result = calibrate.calibrate_engine(llm)
    assert calls == [None, 7e9]
    assert result.bandwidth_source == "probed" and result.cost_model.bandwidth == 7e9


def test_fit_recovers_a_context_cost_beyond_the_bytes():
    # A CPU's paged attention: every context token costs 10 µs on top of its bytes.
    slow_attention = CostModel(bandwidth=40e9, flops=150e9, overhead_s=0.04, attention_s_per_token=1e-5, **SIZES)
    steps = synthetic_steps(slow_attention)
    fitted = fit_cost_model(steps, **SIZES, bandwidth=40e9)
    assert fitted.attention_s_per_token == pytest.approx(1e-5, rel=1e-6)
    assert fitted.flops == pytest.approx(150e9, rel=1e-6) and fitted.overhead_s == pytest.approx(0.04, rel=1e-6)
    assert fit_cost_model(synthetic_steps(TRUE), **SIZES).attention_s_per_token == pytest.approx(0.0, abs=1e-12)
