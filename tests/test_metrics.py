"""Metrics on small hand-built traces whose answers can be worked out on paper."""

import math

import numpy as np
import pytest

from labkit.metrics import parse_slo, summarize
from labkit.trace import RequestRecord, StepRecord, Trace


def record(rid, arrival, tokens, finish=None, scheduled=None, prompt_len=10, reason="stop", preemptions=0):
    """A finished request; it finishes with its last token unless ``finish`` says otherwise."""
    finish = tokens[-1] if finish is None else finish
    return RequestRecord(
        rid,
        arrival,
        prompt_len,
        first_scheduled_time=scheduled,
        token_times=list(tokens),
        finish_time=finish,
        num_preemptions=preemptions,
        finish_reason=reason,
    )


def step(index, active, slots_held, start=0.0, end=0.1):
    return StepRecord(index, start, end, {f"r{i}": 1 for i in range(active)}, 0, active, slots_held, 0)


@pytest.fixture
def trace():
    # a: arrives 0, scheduled 0.1, tokens at 0.5, 0.7, 1.0, 1.2 -> TTFT 0.5, TPOT (1.2-0.5)/3, ITL .2 .3 .2
    # b: arrives 1, scheduled 1.0, tokens at 1.5, 2.0            -> TTFT 0.5, TPOT 0.5, ITL .5
    # c: arrives 2, scheduled 2.5, one token at 4.0               -> TTFT 2.0, no TPOT, no ITL
    return Trace(
        requests=[
            record("a", 0.0, [0.5, 0.7, 1.0, 1.2], scheduled=0.1, prompt_len=10),
            record("b", 1.0, [1.5, 2.0], scheduled=1.0, prompt_len=20, preemptions=2),
            record("c", 2.0, [4.0], scheduled=2.5, prompt_len=30),
        ],
        steps=[step(0, 2, 4), step(1, 3, 4), step(2, 1, 4)],
    )


def test_latencies_match_vllm_definitions(trace):
    s = summarize(trace)
    assert s.num_completed == 3
    assert s.ttft_ms.values == pytest.approx([500, 500, 2000])
    assert s.tpot_ms.values == pytest.approx([700 / 3, 500])  # c has one token: no TPOT
    assert sorted(s.itl_ms.values) == pytest.approx([200, 200, 300, 500])
    assert s.e2el_ms.values == pytest.approx([1200, 1000, 2000])
    assert s.queue_ms.values == pytest.approx([100, 0, 500])
    assert s.num_preemptions == 2


def test_percentiles_are_numpy_linear_and_std_is_population(trace):
    ttft = summarize(trace).ttft_ms
    assert ttft.mean == pytest.approx(1000)
    assert ttft.median == pytest.approx(500)
    assert ttft.p90 == pytest.approx(500 + 0.8 * 1500)  # rank 1.8 between 500 and 2000
    assert ttft.p99 == pytest.approx(500 + 0.98 * 1500)
    assert ttft.std == pytest.approx(np.sqrt(((500 - 1000) ** 2 * 2 + 1000**2) / 3))


def test_throughput_over_first_arrival_to_last_finish(trace):
    s = summarize(trace)
    assert s.duration_s == pytest.approx(4.0)
    assert s.request_throughput == pytest.approx(3 / 4)
    assert s.total_output_tokens == 7 and s.total_input_tokens == 60
    assert s.output_throughput == pytest.approx(7 / 4)
    assert s.total_token_throughput == pytest.approx(67 / 4)


def test_goodput_counts_requests_meeting_every_limit(trace):
    # TTFT <= 600 ms drops c; TPOT <= 300 ms drops b (500 ms). Only a is good.
    s = summarize(trace, slo="ttft:600 tpot:300")
    assert s.num_good == 1 and s.goodput == pytest.approx(1 / 4)
    # A one-token answer counts as TPOT 0, so c passes a TPOT-only SLO, as in vLLM.
    assert summarize(trace, slo={"tpot": 300}).num_good == 2
    assert summarize(trace, slo=["e2el:1000"]).num_good == 1  # exactly at the limit passes
    assert summarize(trace).goodput is None


def test_slot_utilisation_and_padding_from_steps(trace):
    s = summarize(trace)
    assert s.slot_utilization == pytest.approx(6 / 12)
    assert s.padded_slot_steps == 6
    assert s.mean_batch_size == pytest.approx(2)


def test_rejected_and_unfinished_are_reported_not_averaged(trace):
    trace.requests.append(record("x", 0.5, [], finish=0.5, reason="rejected", prompt_len=9999))
    trace.requests.append(RequestRecord("u", 3.0, 5, first_scheduled_time=3.5, token_times=[3.9]))
    s = summarize(trace, slo="ttft:5000")
    assert s.num_requests == 5 and s.num_completed == 3
    assert s.rejected_ids == ["x"] and s.unfinished_ids == ["u"]
    assert s.ttft_ms.count == 3 and s.total_input_tokens == 60  # neither x nor u counted
    assert s.num_good == 3 and (s.num_rejected, s.num_unfinished) == (1, 1)


def test_empty_distribution_is_nan_not_zero():
    only_one_token = Trace(requests=[record("a", 0.0, [1.0])])
    s = summarize(only_one_token)
    assert s.tpot_ms.count == 0 and math.isnan(s.tpot_ms.median) and math.isnan(s.slot_utilization)


def test_to_dict_uses_vllm_names(trace):
    d = summarize(trace).to_dict()
    assert d["median_ttft_ms"] == pytest.approx(500) and d["completed"] == 3
    assert d["p99_tpot_ms"] == pytest.approx(700 / 3 + 0.99 * (500 - 700 / 3))


def test_empty_trace_is_a_clear_error():
    with pytest.raises(ValueError, match="no requests"):
        summarize(Trace())


@pytest.mark.parametrize(
    "bad, message",
    [
        ("ttft=500", "no ':'"),
        ("latency:500", "unknown SLO metric"),
        ("ttft:fast", "not a number"),
        ("ttft:-5", "positive"),
        ("ttft:0", "positive"),
        ("ttft:500 ttft:400", "twice"),
        ("", "empty"),
    ],
)
def test_bad_slo_strings_are_clear_errors(bad, message):
    with pytest.raises(ValueError, match=message):
        parse_slo(bad)


def test_parse_slo_accepts_vllm_style():
    assert parse_slo("ttft:500 tpot:50") == {"ttft": 500.0, "tpot": 50.0}
    assert parse_slo(["ttft:500", "e2el:2000"]) == {"ttft": 500.0, "e2el": 2000.0}


def test_speculative_decoding_counts_follow_vllm(trace):
    # step 0: two requests verified 3 drafts each, 4 accepted in all; step 1: one request, 2 drafts, none accepted
    trace.steps[0].num_drafts, trace.steps[0].num_draft_tokens, trace.steps[0].num_accepted_tokens = 2, 6, 4
    trace.steps[1].num_drafts, trace.steps[1].num_draft_tokens, trace.steps[1].num_accepted_tokens = 1, 2, 0
    s = summarize(trace)
    assert (s.spec_decode_num_drafts, s.spec_decode_num_draft_tokens, s.spec_decode_num_accepted_tokens) == (3, 8, 4)
    assert s.spec_decode_acceptance_rate == pytest.approx(4 / 8)
    assert s.spec_decode_mean_acceptance_length == pytest.approx(1 + 4 / 3)
    assert s.to_dict()["spec_decode_num_accepted_tokens"] == 4


def test_without_speculation_its_rates_are_nan_and_not_shown(trace):
    s = summarize(trace)
    assert math.isnan(s.spec_decode_acceptance_rate) and math.isnan(s.spec_decode_mean_acceptance_length)
