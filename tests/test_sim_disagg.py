"""The simulator's disaggregated fleet: decode steps free of prompt chunks keep the 50 ms promise where chunked
prefill's 512-token steps break it; a slow link or too few prefill GPUs lose it on TTFT; no throughput is gained."""

from __future__ import annotations

import math

import pytest
from script_loader import load_script

from labkit.capacity import SALE_EXAMPLE, sale_fleet_gpu
from labkit.sim.cost_model import CostModel
from labkit.sim.disagg import (
    ETHERNET_1G,
    INSTANT,
    RDMA,
    Link,
    disaggregation_table,
    kept_share,
    lesson_sale,
    simulate_disaggregated,
)
from labkit.sim.fleet import simulate_fleet
from labkit.sim.simulator import blocks_that_fit

COST = CostModel.from_parts(SALE_EXAMPLE["hardware"], SALE_EXAMPLE["model"], SALE_EXAMPLE["overhead_s"])
DIALS = dict(num_blocks=blocks_that_fit(SALE_EXAMPLE["hardware"], SALE_EXAMPLE["model"]), max_num_seqs=128)
HIGH_LOAD = lesson_sale(160, rate=20.0, seed=0)


@pytest.fixture(scope="module")
def chunked():
    return simulate_fleet(HIGH_LOAD, COST, "chunked", replicas=4, max_num_batched_tokens=512, **DIALS)


@pytest.fixture(scope="module")
def split():
    return simulate_disaggregated(HIGH_LOAD, COST, prefill_gpus=2, decode_gpus=2, link=INSTANT, **DIALS)


def test_every_request_is_served_once_with_its_length(split):
    records = {r.request_id: r for r in split.trace.requests}
    assert len(records) == len(HIGH_LOAD)
    assert all(records[spec.request_id].output_len == spec.output_len for spec in HIGH_LOAD)
    assert all(r.finish_reason == "length" for r in records.values())
    decoded = [r.request_id for trace in split.traces[2:] for r in trace.requests]
    assert sorted(decoded) == sorted(spec.request_id for spec in HIGH_LOAD if spec.output_len > 1), "each once"


def test_decode_steps_carry_no_prefill_so_the_itl_tail_is_below_chunked(split, chunked):
    decode_steps = [step for trace in split.traces[2:] for step in trace.steps]
    prefill_steps = [step for trace in split.traces[:2] for step in trace.steps]
    assert sum(step.num_prefill_tokens for step in decode_steps) == 0
    assert sum(step.num_decode_tokens for step in prefill_steps) == 0, "the prefill GPUs hand over before decoding"
    assert split.summary().itl_ms.p99 < 0.5 * chunked.summary().itl_ms.p99
    assert chunked.summary().itl_ms.p99 > 50 > split.summary().itl_ms.p99
    assert kept_share(split, 50) > kept_share(chunked, 50)


def test_splitting_the_phases_buys_no_throughput():
    """Past what four GPUs can serve, every split finishes fewer requests a second than the four colocated."""
    overload = lesson_sale(200, rate=40.0, seed=0)
    together = simulate_fleet(overload, COST, "chunked", replicas=4, max_num_batched_tokens=512, **DIALS)
    for prefill_gpus in (1, 2, 3):
        apart = simulate_disaggregated(
            overload, COST, prefill_gpus=prefill_gpus, decode_gpus=4 - prefill_gpus, link=INSTANT, **DIALS
        )
        assert apart.summary().request_throughput < together.summary().request_throughput


def test_a_very_slow_link_or_too_few_prefill_gpus_lose_on_ttft(split, chunked):
    slow = simulate_disaggregated(HIGH_LOAD, COST, prefill_gpus=2, decode_gpus=2, link=ETHERNET_1G, **DIALS)
    starved = simulate_disaggregated(HIGH_LOAD, COST, prefill_gpus=1, decode_gpus=3, link=INSTANT, **DIALS)
    assert slow.summary().ttft_ms.p99 > 10 * split.summary().ttft_ms.p99
    assert starved.summary().ttft_ms.p99 > 2 * split.summary().ttft_ms.p99
    for losing in (slow, starved):
        assert losing.summary().ttft_ms.p99 > 2 * chunked.summary().ttft_ms.p99


def test_one_request_waits_exactly_its_transfer():
    one = lesson_sale(1, rate=1.0, seed=3)
    link = Link(2e9, latency_s=0.004)
    runs = [
        simulate_disaggregated(one, COST, prefill_gpus=1, decode_gpus=1, link=chosen, **DIALS)
        for chosen in (INSTANT, link)
    ]
    ttft = [run.requests()[0].ttft_s for run in runs]
    expected = COST.kv_bytes_per_token * one[0].prompt_len / link.bandwidth + link.latency_s
    assert math.isclose(ttft[1] - ttft[0], expected, rel_tol=1e-6)


def test_bad_setups_are_refused():
    with pytest.raises(ValueError, match="prefill_gpus must be a whole number, 1 or more"):
        simulate_disaggregated(HIGH_LOAD, COST, prefill_gpus=0, decode_gpus=2, **DIALS)
    with pytest.raises(ValueError, match="positive bandwidth"):
        Link(0.0)
    with pytest.raises(ValueError, match="same number of GPUs"):
        disaggregation_table((8.0,), setups=((2, 2, RDMA), (1, 2, RDMA)), num_requests=10, **sale_fleet_gpu())


def test_the_table_has_a_row_per_setup_and_rate():
    rows = disaggregation_table(
        (16.0,), setups=((2, 2, RDMA),), chunk_budgets=(512,), num_requests=40, **sale_fleet_gpu()
    )
    assert [row.setup for row in rows] == ["chunked (512-token steps)", "2P+2D, 400 Gb/s RDMA"]
    assert rows[1].itl_p99_ms < rows[0].itl_p99_ms


def test_the_script_prints_the_table(capsys):
    table = load_script("disagg_table").main(["--rates", "16", "--requests", "30"])
    lines = table.splitlines()
    assert "ITL p99" in lines[0] and "TTFT p99" in lines[0]
    assert sum("chunked" in line for line in lines) == 2 and sum("P+" in line for line in lines) == 6
    assert table in capsys.readouterr().out
