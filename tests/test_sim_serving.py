"""The simulator's prediction of a load sweep: the load tester's own requests, the client's TPOT, its best-rate rule."""

import numpy as np
import pytest

from labkit.sim import serving
from labkit.sim.cost_model import CostModel
from labkit.sim.serving import (
    RatePrediction,
    as_the_server_sees_it,
    format_predictions,
    predict_sweep,
    predicted_highest_rate,
    quick_waves,
    random_load,
)
from labkit.sim.simulator import simulate
from labkit.slo import Promise
from labkit.workloads import make_workload

# About what a quick calibration fits for SmolLM2-135M in fp32 on a 2-core CPU: overhead-heavy steps.
CPU_LIKE = CostModel(
    bandwidth=30e9,
    flops=90e9,
    weight_bytes=5.4e8,
    overhead_s=0.04,
    kv_bytes_per_token=46_080.0,
    flops_per_token=2.7e8,
    attention_s_per_token=2e-5,
)
DIALS = dict(max_num_seqs=8, max_model_len=512, num_blocks=256, block_size=16)


@pytest.fixture
def simulated(monkeypatch) -> list:
    """Every (workload, trace) that predict_sweep hands to and gets from the simulator, in order."""
    seen = []

    def recording_simulate(workload, cost, policy, **dials):
        trace = simulate(workload, cost, policy, **dials)
        seen.append((workload, trace))
        return trace

    monkeypatch.setattr(serving, "simulate", recording_simulate)
    return seen


def test_the_simulated_requests_are_the_load_testers_own(simulated):
    predict_sweep(CPU_LIKE, [2.0, 8.0], num_prompts=6, input_len=40, output_len=10, seed=3)
    assert len(simulated) == 2
    for rate, (workload, trace) in zip([2.0, 8.0], simulated):
        sent = make_workload("random", 6, rate, seed=3, input_len=40, output_len=10)
        assert workload.arrival_times.tolist() == sent.arrival_times.tolist()
        assert workload.prompt_lens.tolist() == sent.prompt_lens.tolist() == [40] * 6
        assert workload.output_lens.tolist() == sent.output_lens.tolist() == [10] * 6
        assert [r.arrival_time for r in trace.requests] == sent.arrival_times.tolist()
        assert [r.output_len for r in trace.requests] == [10] * 6  # every answer runs to its full length
    assert (
        simulated[0][0].arrival_times.tolist() != simulated[1][0].arrival_times.tolist()
    )  # the rate moves the arrivals


def test_random_load_is_make_workload_for_any_seed():
    for seed in (0, 5):
        ours = random_load(5, 3.0, input_len=20, output_len=7, seed=seed)
        theirs = make_workload("random", 5, 3.0, seed=seed, input_len=20, output_len=7)
        assert ours == theirs


def test_tpot_is_the_clients_finish_minus_first_token_over_the_tokens_after_the_first():
    (alone,) = predict_sweep(CPU_LIKE, [1.0], num_prompts=1, input_len=32, output_len=12, **DIALS)
    decode_steps = [CPU_LIKE.pass_time(1, 32 + k) for k in range(11)]  # tokens 2..12, each reading its context
    assert alone.p99_tpot_ms == pytest.approx(np.mean(decode_steps) * 1000)
    assert alone.median_tpot_ms == pytest.approx(alone.p99_tpot_ms)
    assert alone.p99_ttft_ms == pytest.approx(CPU_LIKE.pass_time(32, 0) * 1000)  # the prefill, not part of TPOT
    assert (alone.completed, alone.num_requests, alone.lost) == (1, 1, 0)


def test_a_saturating_load_predicts_worse_tpot_as_the_rate_rises():
    rates = [0.5, 1, 2, 4, 8, 16, 32]
    predictions = predict_sweep(CPU_LIKE, rates, num_prompts=16, input_len=32, output_len=12, **DIALS)
    assert [p.rate for p in predictions] == rates
    assert all(p.completed == 16 for p in predictions)
    p99 = [p.p99_tpot_ms for p in predictions]
    assert all(later >= earlier * 0.97 for earlier, later in zip(p99, p99[1:])), p99
    assert p99[-1] > 1.5 * p99[0]  # batches of 8 cost more per step than one sequence alone
    ttft = [p.p99_ttft_ms for p in predictions]
    assert ttft[-1] > 3 * ttft[0]  # and the queue grows


def test_a_load_the_server_would_refuse_is_a_clear_error():
    with pytest.raises(ValueError, match="44 tokens .* more than max_model_len=40.*would refuse it"):
        predict_sweep(CPU_LIKE, [1.0], num_prompts=2, input_len=32, output_len=12, max_model_len=40)


class TemplateTokenizer:
    """A chat template that puts the same 20-token system prompt before every message; one token per word."""

    def __init__(self):
        self.vocabulary: dict[str, int] = {}

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return " ".join(["system"] * 20 + [message["content"] for message in messages])

    def encode(self, text, add_special_tokens=True):
        return [self.vocabulary.setdefault(word, len(self.vocabulary)) for word in text.split()]


def test_with_the_servers_tokenizer_the_simulator_computes_the_servers_prompts(simulated):
    sent = random_load(2, 0.01, input_len=32, output_len=12)  # the second arrives long after the first finished
    seen = as_the_server_sees_it(sent, TemplateTokenizer())
    words = [len(request.prompt[0]["content"].split()) for request in sent]
    assert seen.prompt_lens.tolist() == [20 + n for n in words]
    assert all(isinstance(token, int) for request in seen for token in request.prompt)
    assert seen.arrival_times.tolist() == sent.arrival_times.tolist()

    (with_template,) = predict_sweep(
        CPU_LIKE, [0.01], num_prompts=2, input_len=32, output_len=12, tokenizer=TemplateTokenizer()
    )
    (without,) = predict_sweep(CPU_LIKE, [0.01], num_prompts=2, input_len=32, output_len=12)
    prefills = [step.scheduled["req-1"] for step in simulated[0][1].steps if step.scheduled.get("req-1", 0) > 1]
    assert prefills == [20 + words[1] - 16]  # the template's first block of 16 tokens came from the prefix cache
    ttfts = [CPU_LIKE.pass_time(20 + words[0], 0), CPU_LIKE.pass_time(20 + words[1] - 16, 16)]
    assert with_template.p99_ttft_ms == pytest.approx(np.percentile(ttfts, 99) * 1000)
    assert without.p99_ttft_ms == pytest.approx(CPU_LIKE.pass_time(32, 0) * 1000)


def prediction(
    rate: float, p99_tpot_ms: float, completed: int = 6, num_requests: int | None = 6, ttft: float = 100.0
) -> RatePrediction:
    return RatePrediction(rate, p99_tpot_ms, p99_tpot_ms / 2, ttft, completed, num_requests)


def test_the_simulator_signs_with_labkits_rule():
    """Its predictions are RateResults as they are (the rule's own cases are in test_slo.py)."""
    sweep = [prediction(4, 200), prediction(1, 50), prediction(8, 90), prediction(2, 80)]
    assert predicted_highest_rate(sweep, Promise(tpot_ms=100)) == 2  # in any order; 8 after 4 failed is noise
    assert predicted_highest_rate([prediction(1, 50, completed=5), prediction(2, 60)], Promise(100)) is None  # lost
    assert predicted_highest_rate([prediction(1, 50, completed=5, num_requests=None)], Promise(100)) == 1  # unknown
    ttft_first = [prediction(rate, 50.0, ttft=100.0 * rate) for rate in (1, 2, 4)]
    assert predicted_highest_rate(ttft_first, Promise(tpot_ms=100, ttft_ms=250)) == 2  # TTFT 400 ms at 4 breaks it


def test_the_table_puts_the_measurement_beside_the_prediction():
    table = format_predictions([prediction(1, 50.0), prediction(2, 80.0)], measured_p99_tpot_ms=[75.0, 120.0])
    lines = table.splitlines()
    assert "measured" in lines[0] and len(lines) == 4
    assert lines[2].split()[-2:] == ["75.0", "1.50"] and lines[3].split()[-2:] == ["120.0", "1.50"]
    assert "measured" not in format_predictions([prediction(1, 50.0)])


def test_quick_waves_run_batches_from_one_to_max_num_seqs():
    assert [batch for batch, _ in quick_waves(8)] == [1, 2, 4, 8]
    assert [batch for batch, _ in quick_waves(6)] == [1, 2, 4, 6]
    assert [batch for batch, _ in quick_waves(1)] == [1]
    assert [batch for batch, _ in quick_waves(256)][-1] == serving.QUICK_MAX_BATCH  # seconds, not minutes
    with pytest.raises(ValueError, match="at least 1"):
        quick_waves(0)


@pytest.mark.usefixtures("one_torch_thread")
def test_quick_calibration_predicts_the_tiny_engines_steps_within_a_loose_factor():
    from labkit.engine import LLM, serve_workload
    from labkit.models import tiny_model
    from labkit.sim.calibrate import model_sizes, step_work
    from labkit.workloads import synthetic_workload

    llm = LLM(tiny_model(), **DIALS)
    calibration = serving.sweep_calibration(llm)
    assert calibration.num_steps >= 40
    # A new load of the sweep's shape, served for real right after each fit: the fit must say roughly how long
    # its steps took. Three fits and loads in turns, judged by the median: a machine whose speed changes between
    # a fit and its load (other jobs starting) moves one pair, not the verdict.
    ratios = []
    for seed in (1, 2, 3):
        cost = serving.quick_calibration(llm, seed=seed)
        assert isinstance(cost, CostModel)
        assert cost.weight_bytes == model_sizes(llm.model)["weight_bytes"]  # counted, not fitted
        measured = step_work(serve_workload(llm, synthetic_workload(6, 8.0, 32, 12, vocab_size=256, seed=10 + seed)))
        steps = zip(measured.new_tokens, measured.context_tokens)
        predicted = np.array([cost.pass_time(int(n), int(c)) for n, c in steps])
        ratios.append(float(np.median(predicted / measured.seconds)))
    assert 0.5 < float(np.median(ratios)) < 2.0, ratios
