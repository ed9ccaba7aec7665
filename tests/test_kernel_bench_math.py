"""labkit.kernels.bench_math, what scripts/kernel_bench.py scores a card by: each pool's bytes counted once, the
peak from the card's own memory clock and bus width (not its name), splits for its multiprocessors, the fraction."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from labkit.kernels.bench_math import (
    PROGRAMS_PER_SM,
    case_bytes,
    copy_bandwidth,
    fraction_of_peak,
    over_peak_warning,
    peak_from_properties,
    splits_for_sms,
)
from labkit.kernels.traffic import DecodeShape

pytestmark = pytest.mark.lab11


def test_each_pool_is_counted_once_and_the_kernel_reads_only_the_tables_beyond_the_contiguous_path():
    shape = DecodeShape([64, 32], block_size=16, num_heads=4, num_kv_heads=2, head_dim=8, dtype_bytes=2)
    token = 2 * 8 * 2  # one token's keys, both KV heads, bf16
    queries = 2 * 4 * 8 * 2
    counts = case_bytes(shape)
    assert counts["sdpa"] == 2 * (64 + 32) * token + queries  # K once, V once
    assert counts["pools"] == 2 * (4 + 2) * 16 * token  # two buffers, six blocks each
    tables = 2 * ((4 + 1) + (2 + 1)) * 4  # each (sequence, KV head) program: its table and its length, int32
    assert counts["kernel"] == counts["sdpa"] + tables
    assert counts["gather"] > counts["kernel"]


# nvidia-smi's maximum memory clocks and the cards' bus widths (HBM3 on the SXM, HBM2e on the PCIe card):
# the same chip name, 3.35 TB/s against 2.0.
H100_SXM = SimpleNamespace(name="NVIDIA H100 80GB HBM3", memory_clock_rate=2_619_000, memory_bus_width=5120)
H100_PCIE = SimpleNamespace(name="NVIDIA H100 PCIe", memory_clock_rate=1_593_000, memory_bus_width=5120)


@pytest.mark.parametrize(("card", "terabytes"), [(H100_SXM, 3.35), (H100_PCIE, 2.04)])
def test_the_peak_comes_from_the_cards_memory_clock_and_bus_width(card, terabytes):
    assert peak_from_properties(card) / 1e12 == pytest.approx(terabytes, abs=0.005)


@pytest.mark.parametrize(
    "properties",
    [SimpleNamespace(name="NVIDIA GH200 480GB"), SimpleNamespace(memory_clock_rate=0, memory_bus_width=5120)],
)
def test_properties_without_a_clock_give_no_peak_whatever_the_name(properties):
    assert peak_from_properties(properties) is None  # the caller measures a copy instead


def test_a_copy_moves_its_size_twice():
    assert copy_bandwidth(2**30, 1e-3) == pytest.approx(2 * 2**30 / 1e-3)
    with pytest.raises(ValueError, match="positive"):
        copy_bandwidth(2**30, 0)


@pytest.mark.parametrize(("sms", "splits"), [(132, 33), (108, 27)])
def test_splits_give_each_multiprocessor_two_programs_at_batch_one(sms, splits):
    # one sequence, Llama-3.1-8B's 8 KV heads, a 32k context (2,048 blocks)
    assert splits_for_sms(sms, batch=1, kv_heads=8, blocks=2048) == splits
    assert 1 * 8 * splits >= PROGRAMS_PER_SM * sms > 1 * 8 * (splits - 1)


def test_splits_stop_at_one_when_the_batch_fills_the_card_and_never_pass_the_blocks():
    assert splits_for_sms(132, batch=64, kv_heads=8, blocks=2048) == 1
    assert splits_for_sms(132, batch=1, kv_heads=3, blocks=4) == 4  # 88 wanted, 4 blocks to give
    with pytest.raises(ValueError, match="sm_count must be 1 or more"):
        splits_for_sms(0, batch=1, kv_heads=8, blocks=16)


def test_the_fraction_of_peak_and_a_warning_past_it_that_names_the_cause():
    peak = peak_from_properties(H100_SXM)
    assert fraction_of_peak(3.0e9, 1e-3, peak) == pytest.approx(3.0e12 / peak)
    assert over_peak_warning(0.9, working_set=2**30, l2_bytes=50 * 2**20) is None
    cached = over_peak_warning(1.4, working_set=2**20, l2_bytes=50 * 2**20)
    assert "140%" in cached and "L2 cache" in cached
    counted_twice = over_peak_warning(1.8, working_set=2**30, l2_bytes=50 * 2**20)
    assert "counted twice" in counted_twice
    with pytest.raises(ValueError, match="positive"):
        fraction_of_peak(1, 1e-3, 0)
