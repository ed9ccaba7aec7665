"""Reload an evicted prefix or compute it again, on a GPU's cost model: short prefixes ride free in a memory-bound
pass, long ones are cheaper to copy back, and a tier slower per token than the arithmetic never wins."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from labkit.capacity import SALE_GPU
from labkit.sim import CostModel, get_hardware, get_model
from labkit.sim.disagg import Link
from labkit.sim.speculation import ACHIEVABLE_FLOPS_FRACTION
from labkit.sim.tier_costs import (
    HOST_PCIE5,
    NVME_SSD,
    TierRace,
    reload_or_recompute_race,
    reload_seconds,
    returning_turn_seconds,
)

MODEL = get_model("llama-3.1-8b")
H100 = get_hardware("h100-sxm")
H100_COST = replace(CostModel.from_parts(H100, MODEL, 0.001), flops=ACHIEVABLE_FLOPS_FRACTION * H100.flops)
LENGTHS = [16, 32, 64, 128, 256, 512, 1024, 4096, 16384]


def test_a_reload_is_its_latency_then_bytes_over_the_link():
    per_token = MODEL.kv_bytes_per_token
    assert reload_seconds(HOST_PCIE5, per_token, 0) == 0.0, "nothing to copy costs nothing, not a latency"
    short, long = (reload_seconds(HOST_PCIE5, per_token, n) - HOST_PCIE5.latency_s for n in (512, 1024))
    assert long == pytest.approx(2 * short), "twice the tokens, twice the bytes"
    assert reload_seconds(NVME_SSD, per_token, 512) > reload_seconds(HOST_PCIE5, per_token, 512)
    with pytest.raises(ValueError, match="prefix_tokens"):
        reload_seconds(HOST_PCIE5, per_token, -1)


def test_without_a_tier_the_turn_prefills_everything_and_an_instant_tier_costs_only_reading_the_kv():
    instant = Link(math.inf, name="instant")
    for prefix in LENGTHS:
        assert returning_turn_seconds(H100_COST, prefix, 100) == H100_COST.prefill_time(prefix + 100)
        reading_it = prefix * H100_COST.kv_bytes_per_token / H100_COST.bandwidth  # the pass reads the reloaded KV
        reloaded = returning_turn_seconds(H100_COST, prefix, 100, instant)
        assert reloaded <= returning_turn_seconds(H100_COST, prefix, 100) + reading_it
    with pytest.raises(ValueError, match="new_tokens"):
        returning_turn_seconds(H100_COST, 64, 0)


def test_on_an_h100_short_prefixes_are_cheaper_to_compute_again_and_long_ones_to_reload():
    race = reload_or_recompute_race(H100_COST, (HOST_PCIE5, NVME_SSD), LENGTHS, new_tokens=100)
    host = race.reload_s[HOST_PCIE5.name]
    assert host[0] > race.recompute_s[0], "16 more tokens in a memory-bound pass are free; the copy is not"
    assert host[-1] < race.recompute_s[-1] / 5, "16K tokens of arithmetic against 2 GiB over PCIe 5.0"
    assert LENGTHS[0] < race.crossover(HOST_PCIE5.name) < LENGTHS[-1]
    assert race.crossover(NVME_SSD.name) > race.crossover(HOST_PCIE5.name), "the slower tier needs a longer prefix"


def test_when_the_new_tokens_already_make_the_pass_compute_bound_reloading_wins_from_the_shortest_prefix():
    sale_cost = CostModel.from_parts(SALE_GPU, MODEL)  # critical batch about 75 tokens: 100 new ones are past it
    race = reload_or_recompute_race(sale_cost, (HOST_PCIE5,), LENGTHS, new_tokens=100)
    assert race.crossover(HOST_PCIE5.name) == LENGTHS[0]


def test_a_tier_slower_per_token_than_the_arithmetic_never_wins():
    arithmetic_per_token = H100_COST.flops_per_token / H100_COST.flops
    slow = Link(0.5 * MODEL.kv_bytes_per_token / arithmetic_per_token, name="half the arithmetic's pace")
    race = reload_or_recompute_race(H100_COST, (slow,), LENGTHS)
    assert race.crossover(slow.name) is None
    assert all(copy > recompute for copy, recompute in zip(race.reload_s[slow.name], race.recompute_s))


def test_the_crossover_is_where_reloading_stays_faster():
    race = TierRace((16, 64, 256, 1024), (1.0, 1.0, 1.0, 1.0), {"tier": (0.5, 2.0, 0.5, 0.5)})
    assert race.crossover("tier") == 256, "a win at 16 followed by a loss at 64 is no crossover"
    assert TierRace((16, 64), (1.0, 1.0), {"tier": (0.5, 2.0)}).crossover("tier") is None


@pytest.mark.parametrize(
    "lengths, tiers, complaint",
    [([], (HOST_PCIE5,), "prefix lengths"), ([0, 16], (HOST_PCIE5,), "prefix lengths"),
     ([16], (HOST_PCIE5, HOST_PCIE5), "own name")],
)  # fmt: skip
def test_bad_input_is_refused_by_name(lengths, tiers, complaint):
    with pytest.raises(ValueError, match=complaint):
        reload_or_recompute_race(H100_COST, tiers, lengths)
