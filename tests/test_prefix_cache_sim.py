"""Prefix caching on the simulator's clock: declared shared prefixes, synthetic ids, and the saving."""

import pytest

from labkit.capacity import LESSON_LLAMA_8B, SALE_GPU
from labkit.metrics import summarize
from labkit.sim import CostModel
from labkit.sim.simulator import blocks_that_fit, prompt_token_ids, simulate
from labkit.workloads import RequestSpec, sale_workload

COST = CostModel.from_parts(SALE_GPU, LESSON_LLAMA_8B, overhead_s=0.003)
BLOCKS = blocks_that_fit(SALE_GPU, LESSON_LLAMA_8B)


def test_synthetic_ids_share_exactly_the_declared_prefix():
    markers: dict[str, int] = {}
    a = prompt_token_ids(RequestSpec("a", 0.0, 40, 1, prefix_id="sys", prefix_len=32), 0, markers)
    b = prompt_token_ids(RequestSpec("b", 0.0, 50, 1, prefix_id="sys", prefix_len=32), 1, markers)
    c = prompt_token_ids(RequestSpec("c", 0.0, 40, 1, prefix_id="other", prefix_len=32), 2, markers)
    d = prompt_token_ids(RequestSpec("d", 0.0, 40, 1), 3, markers)
    assert (len(a), len(b)) == (40, 50) and a[:32] == b[:32] and a[32] != b[32]
    assert c[0] != a[0] and d[0] != a[0]
    assert prompt_token_ids(RequestSpec("e", 0.0, 3, 1, prompt=[7, 8, 9]), 4, markers) == [7, 8, 9]


@pytest.mark.parametrize("bad", [dict(prefix_id="sys"), dict(prefix_len=8), dict(prefix_id="sys", prefix_len=41)])
def test_a_shared_prefix_needs_an_id_and_a_length_within_the_prompt(bad):
    with pytest.raises(ValueError, match="shared prefix needs both"):
        RequestSpec("a", 0.0, 40, 1, **bad)


def test_a_sale_with_a_1000_token_system_prompt_computes_a_tenth_of_the_prefill_and_answers_sooner():
    workload = sale_workload(64, rate=8.0, seed=1).with_shared_prefix(1000)
    runs = {on: simulate(workload, COST, num_blocks=BLOCKS, enable_prefix_caching=on) for on in (True, False)}
    prefill = {on: sum(step.num_prefill_tokens for step in trace.steps) for on, trace in runs.items()}
    on, off = summarize(runs[True]), summarize(runs[False])
    assert prefill[True] < 0.1 * prefill[False]
    assert on.ttft_ms.median < off.ttft_ms.median and on.prefix_cache_hit_rate > 0.9
    assert off.prefix_cache_queries == 0 and runs[True].meta["enable_prefix_caching"] is True


def test_without_a_declared_prefix_the_simulator_finds_nothing_to_share():
    trace = simulate(sale_workload(32, seed=2), COST, num_blocks=BLOCKS)
    assert summarize(trace).prefix_cache_hits == 0
