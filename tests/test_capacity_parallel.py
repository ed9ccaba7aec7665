"""Planning across GPUs: tensor parallelism's split and all-reduces, replicas, and the fleet for the 10x sale.

Every expected value is worked out by hand here from the presets' published figures, not
taken from the planner.
"""

import math
from dataclasses import replace

import pytest

from labkit.capacity import (
    LESSON_LLAMA_8B,
    SALE_70B_EXAMPLE,
    SALE_EXAMPLE,
    SALE_GPU,
    plan,
    sale_load,
    size_fleet,
    with_precision,
)
from labkit.capacity.parallel import LLAMA_3_1_70B, tensor_split
from labkit.cli import main
from labkit.sim import CostModel, Hardware
from labkit.sim.hardware import PRESETS

PARAMS_70B = 70_553_706_496
# Datasheet figures; NVLink 4: 900 GB/s both ways. The planner rates arithmetic at half the peak (its one convention).
H100 = dict(memory=80e9, bandwidth=3.35e12, flops=989e12 / 2, link=450e9)
MS = 1e3


def seventy_b_on_h100(ways: int, **settings):
    return plan("h100-sxm", LLAMA_3_1_70B, 1000, 300, tensor_parallel=ways, **settings)


class TestSeventyBOnH100ByHand:
    """Llama 3.1 70B in bf16 (80 layers, 8 KV heads of 128, hidden 8192) split 2, 4 and 8 ways."""

    @pytest.mark.parametrize("ways", [2, 4, 8])
    def test_weights_and_kv_per_gpu(self, ways):
        p = seventy_b_on_h100(ways)
        assert p.weight_bytes_per_gpu == PARAMS_70B * 2 / ways  # 70.6, 35.3, 17.6 GB
        assert p.kv_bytes_per_token_per_gpu == 2 * 80 * (8 // ways) * 128 * 2  # 160, 80, 40 KiB
        assert p.kv_budget_bytes == 0.9 * 80e9 - PARAMS_70B * 2 / ways

    @pytest.mark.parametrize("ways, fit", [(2, 6), (4, 344), (8, 1020)])
    def test_conversations_that_fit(self, ways, fit):
        per_gpu_kv = 2 * 80 * (8 // ways) * 128 * 2
        assert math.floor((72e9 - PARAMS_70B * 2 / ways) / (1300 * per_gpu_kv)) == fit
        assert seventy_b_on_h100(ways).conversations == fit

    @pytest.mark.parametrize("ways, per_layer", [(2, 2_097_152), (4, 3_145_728), (8, 3_670_016)])
    def test_allreduce_bytes_and_time(self, ways, per_layer):
        split = tensor_split(PRESETS["h100-sxm"], LLAMA_3_1_70B, ways)
        # A batch of 64: two all-reduces a layer, each of 64 x 8192 x 2 B = 1 MiB, of which a ring
        # sends 2(N-1)/N from each GPU: 4 MiB x (N-1)/N a layer.
        assert per_layer == 2 * 2 * (ways - 1) / ways * 64 * 8192 * 2
        assert split.allreduce_bytes_per_layer(64) == pytest.approx(per_layer)
        assert split.allreduce_s_per_token * 64 == pytest.approx(80 * per_layer / H100["link"])

    @pytest.mark.parametrize("ways", [2, 4, 8])
    def test_decode_step_and_prefill(self, ways):
        p = seventy_b_on_h100(ways, overhead_s=0.003)
        b, kv = p.conversations, 2 * 80 * (8 // ways) * 128 * 2
        memory = (PARAMS_70B * 2 / ways + b * 1150 * kv) / H100["bandwidth"]
        compute = b * 2 * PARAMS_70B / ways / H100["flops"]
        allreduce = 80 * 2 * 2 * (ways - 1) / ways * b * 8192 * 2 / H100["link"]
        assert p.decode_memory_s == pytest.approx(memory)
        assert p.decode_compute_s == pytest.approx(compute)
        assert p.decode_allreduce_s == pytest.approx(allreduce)
        assert p.decode_step_s == pytest.approx(max(memory, compute) + 0.003 + allreduce)
        # Attention's arithmetic on each GPU: 2 x 80 layers x 64/N query heads x 128 x L(L + 1) (tests/test_capacity.py)
        attention = 2 * 80 * (64 // ways) * 128 * 1000 * 1001 / H100["flops"]
        weights = 1000 * 2 * PARAMS_70B / ways / H100["flops"]
        prefill = max(PARAMS_70B * 2 / ways / H100["bandwidth"], weights + attention)
        assert p.prefill_s == pytest.approx(prefill + 0.003 + 80 * 2 * 2 * (ways - 1) / ways * 1000 * 8192 * 2 / 450e9)

    def test_four_ways_in_numbers(self):
        p = seventy_b_on_h100(4, overhead_s=0.003)
        # 344 x 1150 x 80 KiB = 32.4 GB of KV plus 35.3 GB of weights over 3.35 TB/s: 20.2 ms.
        assert round(p.decode_memory_s * MS, 1) == 20.2
        # 344 x 2 x 70.55e9 / 4 / 494.5e12 = 24.5 ms: arithmetic binds, at half the peak.
        assert round(p.decode_compute_s * MS, 1) == 24.5
        # 80 x 2 x 1.5 x 344 x 8192 x 2 B / 450 GB/s = 3.0 ms of all-reduce.
        assert round(p.decode_allreduce_s * MS, 1) == 3.0
        assert round(p.decode_step_s * MS, 1) == round(24.5 + 3 + 3.0, 1)

    def test_the_table_shows_the_split_and_the_allreduce(self):
        table = str(seventy_b_on_h100(8, replicas=3))
        assert "(3 x 8 GPUs)" in table and "minus 17.6 GB of weights (1/8)" in table
        assert "2 x 80 x 1 x 128 x 2 B (1 of 8 heads)" in table and "40 KiB" in table
        assert "all-reduce" in table and "2(8-1)/8" in table and "450 GB/s" in table
        assert "Part 4: the fleet" in table and "3 x 8" in table


class TestOneGpuIsTheSingleGpuPlan:
    def test_tp1_r1_equals_the_plan_without_them(self):
        single = plan(**SALE_EXAMPLE)
        same = plan(**SALE_EXAMPLE, tensor_parallel=1, replicas=1)
        assert same == single and str(same) == str(single)
        assert same.conversations == 328 and round(same.decode_step_s * MS, 1) == 38.0
        assert same.decode_allreduce_s == 0 and same.gpus == 1 and same.hidden_size is None
        assert "all-reduce" not in str(same) and "Part 4" not in str(same)

    def test_replicas_multiply_the_fleet_and_nothing_else(self):
        one, five = plan(**SALE_EXAMPLE), plan(**SALE_EXAMPLE, replicas=5)
        assert five.conversations == one.conversations and five.decode_step_s == one.decode_step_s
        assert five.gpus == 5
        assert five.fleet_request_ceiling_per_s == pytest.approx(5 * one.request_ceiling_per_s)
        assert five.fleet_tokens_per_s == pytest.approx(5 * one.tokens_per_s)
        assert five.fleet_promise_load_per_s == pytest.approx(5 * 5.8198, rel=1e-4)
        assert five.cost_per_million_tokens == one.cost_per_million_tokens  # each GPU earns the same

    def test_a_split_replica_pays_for_all_its_gpus(self):
        p = seventy_b_on_h100(4, price_per_gpu_hour=2.0)
        assert p.cost_per_million_tokens == pytest.approx(2.0 * 4 / 3600 / p.tokens_per_s * 1e6)


class TestThePromiseAcrossGpus:
    def test_the_promise_is_still_a_fixed_point(self):
        p = plan(**SALE_70B_EXAMPLE, tensor_parallel=8)
        split = tensor_split(SALE_GPU, LLAMA_3_1_70B, 8)
        shard_cost = CostModel.from_parts(SALE_GPU, split.shard, SALE_EXAMPLE["overhead_s"])
        b = p.promise_in_flight
        step = shard_cost.decode_step_time(b, p.mean_context) + split.allreduce_s_per_token * b
        assert step / (1 - p.promise_load_per_s * p.prefill_s) == pytest.approx(0.050)
        assert b == pytest.approx(p.promise_load_per_s * 300 * 0.050)


class TestTheTenTimesSale:
    """The sale brings ten times the usual traffic (5.8 requests/s, one card of the worked example)."""

    def test_ten_times_the_usual_load(self):
        assert round(sale_load(10), 1) == 58.2
        assert sale_load(10) == pytest.approx(10 * plan(**SALE_EXAMPLE).promise_load_per_s)

    def test_the_70b_bot_needs_96_cards(self):
        sizing = size_fleet(sale_load(10), **SALE_70B_EXAMPLE)
        best = sizing.best
        assert (best.tensor_parallel, best.replicas, best.gpus) == (8, 12, 96)
        assert best.plan.fleet_promise_load_per_s >= sale_load(10)
        assert str(sizing).count("fewest GPUs") == 1 and "96" in str(sizing)

    def test_every_option_has_just_enough_replicas(self):
        target = sale_load(10)
        options = {o.tensor_parallel: o for o in size_fleet(target, **SALE_70B_EXAMPLE).options}
        assert options[1].replicas is None and "tensor_parallel=2" in options[1].why_not
        for ways in (2, 4, 8):
            o = options[ways]
            per_replica = o.plan.promise_load_per_s
            assert o.replicas * per_replica >= target > (o.replicas - 1) * per_replica
            assert o.plan.replicas == o.replicas and o.gpus == ways * o.replicas
        assert [options[w].gpus for w in (2, 4, 8)] == [284, 108, 96]

    def test_the_8b_bot_needs_exactly_ten_of_todays_cards(self):
        option = next(o for o in size_fleet(sale_load(10), **SALE_EXAMPLE).options if o.tensor_parallel == 1)
        assert option.replicas == 10  # not 11: ten times a load is ten cards

    def test_without_a_promise_the_ceiling_sizes_the_fleet(self):
        settings = {**SALE_70B_EXAMPLE, "promise_s": None}
        o = size_fleet(sale_load(10), tensor_parallel=(8,), **settings).best
        assert o.replicas == math.ceil(sale_load(10) / o.plan.request_ceiling_per_s)

    def test_cli_sizes_the_fleet(self, capsys):
        assert main(["plan", "--example", "sale-70b", "--load", "10x"]) == 0
        out = capsys.readouterr().out
        assert "Fleet for 58.2 requests/s within the promise" in out and "(12 x 8 GPUs)" in out
        assert main(["plan", "--example", "sale-70b", "--load", "59", "--tensor-parallel", "4"]) == 0
        assert "(28 x 4 GPUs)" in capsys.readouterr().out

    def test_cli_plans_a_fleet(self, capsys):
        assert main(["plan", "--example", "sale-70b", "--tensor-parallel", "8", "--replicas", "12"]) == 0
        out = capsys.readouterr().out
        assert "Part 4: the fleet, 12 replica(s) of 8 GPU(s)" in out and "1,020" in out


class TestBadInputs:
    def test_the_70b_on_one_card_names_the_split(self):
        with pytest.raises(ValueError, match=r"141.1 GB\) do not fit.*tensor_parallel=2.*quantize"):
            plan(**SALE_70B_EXAMPLE)

    def test_no_conversation_fits_split_two_ways_names_four(self):
        with pytest.raises(
            ValueError, match=r"not one conversation of 9,300 tokens.*each of 2 GPUs.*tensor_parallel=4"
        ):
            plan(**{**SALE_70B_EXAMPLE, "prompt_len": 9000}, tensor_parallel=2)

    def test_too_big_even_for_a_node(self):
        huge = replace(LLAMA_3_1_70B, name="700B", parameters=700e9)
        with pytest.raises(ValueError, match="do not fit") as error:
            plan("h100-sxm", huge, 100, 100, tensor_parallel=8)
        assert "split the model" not in str(error.value) and "quantize" in str(error.value)

    @pytest.mark.parametrize("ways", [0, 16, 1.5, "2"])
    def test_tensor_parallel_outside_a_node(self, ways):
        with pytest.raises(ValueError, match="tensor_parallel must be a whole number from 1 to 8"):
            seventy_b_on_h100(ways)

    def test_tensor_parallel_that_splits_kv_heads_unevenly(self):
        with pytest.raises(ValueError, match="cannot share .* 8 KV heads evenly"):
            seventy_b_on_h100(3)

    @pytest.mark.parametrize("replicas", [0, -1, 2.5])
    def test_replicas(self, replicas):
        with pytest.raises(ValueError, match="replicas must be a whole number"):
            plan(**SALE_EXAMPLE, replicas=replicas)

    def test_no_interconnect(self):
        islands = replace(PRESETS["h100-sxm"], interconnect_bandwidth=0.0)
        with pytest.raises(ValueError, match="no interconnect bandwidth.*interconnect_bandwidth="):
            plan(islands, LLAMA_3_1_70B, 100, 100, tensor_parallel=2)
        assert plan(islands, "llama-3.1-8b", 100, 100, replicas=4).gpus == 4  # replicas need no link

    def test_negative_interconnect(self):
        with pytest.raises(ValueError, match="interconnect_bandwidth must be 0 or more"):
            Hardware("bad", 80e9, 2e12, 1e14, interconnect_bandwidth=-1.0)

    def test_unknown_hidden_size(self):
        odd = replace(LLAMA_3_1_70B, name="odd", layers=81)
        with pytest.raises(ValueError, match="hidden size of odd is not known; pass hidden_size="):
            plan("h100-sxm", odd, 100, 100, tensor_parallel=2)
        assert plan("h100-sxm", odd, 100, 100, tensor_parallel=2, hidden_size=8192).hidden_size == 8192

    def test_quantized_presets_keep_their_hidden_size(self):
        assert (
            plan("h100-sxm", with_precision(LESSON_LLAMA_8B, weights="int4"), 100, 100, tensor_parallel=2).hidden_size
            == 4096
        )

    def test_size_fleet_inputs(self):
        with pytest.raises(ValueError, match="load_per_s must be positive"):
            size_fleet(0, **SALE_70B_EXAMPLE)
        with pytest.raises(ValueError, match="drop replicas"):
            size_fleet(10, **SALE_70B_EXAMPLE, replicas=2)
        with pytest.raises(ValueError, match="no tensor-parallel size of \\(1,\\) fits"):
            size_fleet(10, tensor_parallel=(1,), **SALE_70B_EXAMPLE)
        with pytest.raises(ValueError, match="multiple must be positive"):
            sale_load(0)

    def test_cli_errors(self, capsys):
        assert main(["plan", "--example", "sale-70b", "--load", "10x", "--replicas", "3"]) == 2
        assert "drop --replicas" in capsys.readouterr().err
        assert main(["plan", "--example", "sale-70b", "--tensor-parallel", "1"]) == 2  # bare, it is split 8 ways
        assert "--tensor-parallel 2" in capsys.readouterr().err
        with pytest.raises(SystemExit):
            main(["plan", "--load", "ten"])
        assert "neither requests/s" in capsys.readouterr().err


def test_the_70b_example_runs_bare_on_the_split_its_fleet_picks(capsys):
    """`labkit plan --example sale-70b` alone: 141 GB fit no card, so it is planned 8 ways (chapter 8's fleet)."""
    assert main(["plan", "--example", "sale-70b"]) == 0
    assert "(1 x 8 GPUs)" in capsys.readouterr().out
    assert main(["plan", "--example", "sale-70b", "--tensor-parallel", "1"]) == 2
    assert "tensor_parallel=2" in capsys.readouterr().err
