"""The four-constant cost model: which resource binds when, and the hardware figures it uses."""

import math

import pytest

from labkit.sim import MODELS, PRESETS, CostModel, Hardware, ModelSpec, SequenceWork, get_hardware, get_model
from labkit.sim.hardware import measure_bandwidth, measure_matmul_rate, probe_this_machine

LLAMA = MODELS["llama-3.1-8b"]
A100 = CostModel.from_parts(PRESETS["a100-80gb"], LLAMA, overhead_s=0.002)


def test_decode_of_one_sequence_is_memory_bound():
    step = A100.step_breakdown([SequenceWork(new_tokens=1, context_len=1000)])
    assert step.bound == "memory"
    assert step.compute_s < step.memory_s / 100  # the arithmetic units are nearly idle


def test_long_prefill_is_compute_bound():
    assert A100.pass_breakdown(4000, 0).bound == "compute"


def test_critical_batch_is_where_weight_read_meets_arithmetic():
    tokens = A100.critical_batch
    assert tokens == pytest.approx(312e12 / 2.039e12 * 2 / 2)
    at = A100.pass_breakdown(tokens, 0)
    assert at.memory_s == pytest.approx(at.compute_s)
    assert A100.pass_breakdown(math.floor(tokens), 0).bound == "memory"
    assert A100.pass_breakdown(math.ceil(tokens), 0).bound == "compute"


def test_decode_crossover_accounts_for_kv_reads():
    batch = A100.decode_crossover_batch(context_len=200)
    step = A100.pass_breakdown(batch, batch * 200)
    assert step.memory_s == pytest.approx(step.compute_s)
    assert batch > A100.critical_batch
    # At long contexts each sequence's KV read outruns its arithmetic: decode never turns compute-bound.
    assert A100.decode_crossover_batch(context_len=100_000) == math.inf


def test_step_time_adds_up_the_batch_and_the_overhead():
    batch = [(1, 100), (1, 300), (50, 0)]
    assert A100.step_time(batch) == A100.pass_time(52, 400)
    no_overhead = CostModel.from_parts(PRESETS["a100-80gb"], LLAMA)
    assert A100.step_time(batch) - no_overhead.step_time(batch) == pytest.approx(0.002)
    assert A100.decode_step_time(4, 250.0) == A100.pass_time(4, 1000)
    assert A100.prefill_time(500, cached_len=100) == A100.pass_time(400, 100)


def test_batching_is_nearly_free_while_memory_bound():
    one, sixteen = A100.decode_step_time(1, 1000), A100.decode_step_time(16, 1000)
    assert sixteen < 1.2 * one  # sixteen times the tokens for under 20% more time


@pytest.mark.parametrize("batch", [[], [(0, 10)], [(1, -1)]])
def test_bad_batches_are_refused(batch):
    with pytest.raises(ValueError, match="batch|sequence"):
        A100.step_time(batch)


def test_zero_rates_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="bandwidth must be positive.*published figure"):
        Hardware("broken", 80e9, 0, 1e12)
    with pytest.raises(ValueError, match="flops must be positive"):
        CostModel(bandwidth=1e12, flops=0, weight_bytes=1e9, overhead_s=0, kv_bytes_per_token=1, flops_per_token=2)
    with pytest.raises(ValueError, match="overhead_s"):
        CostModel.from_parts(PRESETS["h100-sxm"], LLAMA, overhead_s=-1)
    with pytest.raises(ValueError, match="layers must be positive.*config.json"):
        ModelSpec("broken", 1e9, layers=0, kv_heads=1, head_dim=64)


def test_kv_bytes_per_token_follow_the_cache_formula():
    assert LLAMA.kv_bytes_per_token == 128 * 1024  # 2 x 32 layers x 8 heads x 128 dims x 2 bytes
    assert MODELS["smollm2-135m"].kv_bytes_per_token == 2 * 30 * 3 * 64 * 2
    assert LLAMA.weight_bytes == pytest.approx(16.06e9, rel=1e-3)


def test_presets_are_published_peaks_with_a_source():
    for hardware in PRESETS.values():
        assert "peak" in hardware.source and "dense BF16" in hardware.source
    assert get_hardware("H200").bandwidth == 4.8e12
    assert set(PRESETS) >= {"a100-80gb", "h100-sxm", "h200", "b200", "rtx-4090", "mi355x"}


def test_unknown_names_list_the_choices():
    with pytest.raises(ValueError, match="a100-80gb.*this-machine"):
        get_hardware("tpu-v9")
    with pytest.raises(ValueError, match="llama-3.1-8b"):
        get_model("gpt-5")


def test_probe_measures_this_machine():
    assert measure_bandwidth(megabytes=4, repeats=1) > 0
    assert measure_matmul_rate(size=64, repeats=1) > 0
    here = probe_this_machine(copy_megabytes=4, matmul_size=64)
    assert here.bandwidth > 0 and here.flops > 0 and here.memory_bytes > 0
    assert "fp32" in here.source and "bf16" in here.source
    assert CostModel.from_parts(here, MODELS["smollm2-135m"]).prefill_time(10) > 0
