"""The models served now in the planner and the cost model: golden values worked out by hand.

Mixture-of-experts weight reads (batch 1, a middling batch, a batch that covers the experts),
MLA's KV bytes per token, a sliding-window layer's KV at long context, expert against tensor
parallelism's traffic, fp8 arithmetic, and the distinct-experts formula against a seeded routing.
"""

import math
import subprocess
import sys
from dataclasses import replace

import pytest

from labkit.capacity import plan, with_precision
from labkit.capacity.parallel import (
    expert_parallel_bytes_per_token_per_layer,
    tensor_parallel_bytes_per_token_per_layer,
)
from labkit.capacity.planner import _load_by_bisection, load_within_promise
from labkit.capacity.served_models import (
    DEEPSEEK_V3,
    GPT_OSS_20B,
    GPT_OSS_120B,
    MIXTRAL_8X7B,
    QWEN3_30B_A3B,
    SERVED_MODELS,
)
from labkit.sim import MODELS, CostModel, ModelSpec, get_hardware
from labkit.sim.moe import expected_distinct_experts, simulated_distinct_experts

H100 = get_hardware("h100-sxm").achievable()  # 494.5 TFLOP/s, 3.35 TB/s: how the planner rates it


class TestExpertsABatchTouches:
    def test_one_token_touches_its_own_experts_and_a_big_batch_all_of_them(self):
        assert expected_distinct_experts(1, 128, 8) == pytest.approx(8)
        assert expected_distinct_experts(1000, 128, 8) == pytest.approx(128)

    def test_the_formula_by_hand(self):
        # 128 x (1 - (15/16)^16): (15/16)^16 = 0.356074, so 128 x 0.643926 = 82.42
        assert expected_distinct_experts(16, 128, 8) == pytest.approx(82.4225, abs=1e-4)

    @pytest.mark.parametrize("tokens", [1, 4, 16, 64])
    def test_the_formula_matches_a_seeded_simulation_of_routing(self, tokens):
        simulated = simulated_distinct_experts(tokens, 128, 8, trials=300, seed=62)
        assert simulated == pytest.approx(expected_distinct_experts(tokens, 128, 8), rel=0.01)

    def test_a_router_picking_more_experts_than_there_are_is_refused(self):
        with pytest.raises(ValueError, match="top_k"):
            expected_distinct_experts(4, 8, 9)


class TestMixtureWeightReads:
    """Qwen3-30B-A3B in bf16: 30.5B parameters (61.0 GB), 3.3B active (6.6 GB), 128 experts, top-8."""

    def test_one_expert_from_the_published_counts_and_from_the_config(self):
        # (30.5 - 3.3)B / (128 - 8) = 226.7M; the config's 3 x 2048 x 768 x 48 = 226.5M
        assert QWEN3_30B_A3B.expert_parameters == pytest.approx(226.67e6, rel=1e-4)
        assert QWEN3_30B_A3B.expert_parameters == pytest.approx(3 * 2048 * 768 * 48, rel=0.002)
        assert MIXTRAL_8X7B.expert_parameters == pytest.approx(3 * 4096 * 14336 * 32, rel=0.002)

    def test_batch_1_reads_the_active_bytes(self):
        assert QWEN3_30B_A3B.weight_bytes_read(1) == pytest.approx(6.6e9)
        assert MIXTRAL_8X7B.weight_bytes_read(1) == pytest.approx(25.8e9)

    def test_a_batch_of_16_reads_82_experts_worth(self):
        # 61.0 GB - (128 - 82.42) x 0.4533 GB = 61.0 - 20.66 = 40.34 GB
        assert QWEN3_30B_A3B.weight_bytes_read(16) == pytest.approx(40.34e9, rel=1e-4)

    def test_a_batch_that_covers_the_experts_reads_them_all(self):
        # 64 tokens: 125.9 of 128 experts, 60.07 GB; 512 tokens: (15/16)^512 ~ 4e-15, all 61.0 GB
        assert QWEN3_30B_A3B.weight_bytes_read(64) == pytest.approx(60.067e9, rel=1e-4)
        assert QWEN3_30B_A3B.weight_bytes_read(512) == pytest.approx(61.0e9, rel=1e-9)

    def test_a_dense_model_reads_all_its_weights_at_any_batch(self):
        llama = MODELS["llama-3.1-8b"]
        assert llama.weight_bytes_read(1) == llama.weight_bytes_read(256) == llama.weight_bytes

    def test_the_cost_model_computes_with_the_active_parameters(self):
        cost = CostModel.from_parts(H100, QWEN3_30B_A3B)
        assert cost.flops_per_token == 2 * 3.3e9
        assert cost.single_stream_bound == pytest.approx(3.35e12 / 6.6e9)  # 508 tokens/s
        step = cost.pass_breakdown(16, 0)
        assert step.memory_s == pytest.approx(40.34e9 / 3.35e12, rel=1e-4)

    def test_the_mixture_stays_memory_bound_nine_times_longer(self):
        # A dense model turns compute-bound at 494.5 / 3.35 x 2 / 2 = 148 tokens; the mixture's
        # weight read grows with the batch, so its arithmetic catches up only near 1,364 tokens.
        mixture = CostModel.from_parts(H100, QWEN3_30B_A3B)
        dense = CostModel.from_parts(H100, MODELS["qwen3-8b"])
        assert dense.critical_batch == pytest.approx(147.6, abs=0.1)
        batch = mixture.critical_batch
        assert batch * mixture.flops_per_token / mixture.flops == pytest.approx(
            mixture.weight_bytes_read(batch) / mixture.bandwidth, rel=1e-6
        )
        assert batch == pytest.approx(1364.3, abs=0.5)

    def test_gpt_oss_120b_fits_one_80_gb_card_with_its_experts_in_mxfp4(self):
        # 128 x 0.9008B expert parameters at 4.25 bits, the other 1.5B at 2 bytes: 64.2 GB
        assert GPT_OSS_120B.weight_bytes == pytest.approx(64.25e9, rel=1e-3)
        assert plan("h100-sxm", GPT_OSS_120B, 1000, 300).conversations >= 100
        all_bf16 = with_precision(GPT_OSS_120B, weights="bf16")
        assert all_bf16.weight_bytes == pytest.approx(233.6e9)
        with pytest.raises(ValueError, match="tensor_parallel=4"):
            plan("h100-sxm", all_bf16, 1000, 300)


class TestLatentAttention:
    def test_deepseek_v3_caches_512_plus_64_values_per_token_and_layer(self):
        assert DEEPSEEK_V3.kv_bytes_per_token_per_layer == (512 + 64) * 2 == 1152
        assert DEEPSEEK_V3.kv_bytes_per_token == 61 * 1152 == 70_272
        assert with_precision(DEEPSEEK_V3, kv="fp8").kv_bytes_per_token == 35_136
        # keys and values for its 128 heads would be 2 x 61 x 128 x 128 x 2 = 3,997,696 bytes: 57x more
        assert 2 * 61 * 128 * 128 * 2 / DEEPSEEK_V3.kv_bytes_per_token == pytest.approx(56.9, abs=0.1)

    def test_every_gpu_of_a_split_keeps_the_whole_latent(self):
        split = plan("h200", DEEPSEEK_V3, 1000, 300, tensor_parallel=8)
        assert split.kv_bytes_per_token_per_gpu == 70_272
        assert split.kv_bytes_per_conversation == 1300 * 70_272
        assert "61 x (512 + 64) x 2 B, latent on every GPU" in str(split)

    def test_half_a_latent_is_refused(self):
        with pytest.raises(ValueError, match="kv_lora_rank and qk_rope_head_dim"):
            replace(DEEPSEEK_V3, qk_rope_head_dim=None)


class TestSlidingWindows:
    """gpt-oss-120b: 36 layers of 8 KV heads x 64, 2,048 bytes a token a layer; 18 slide over 128 tokens."""

    def test_a_sliding_layer_holds_the_window_at_long_context(self):
        per_layer = GPT_OSS_120B.kv_bytes_per_token_per_layer
        assert per_layer == 2 * 8 * 64 * 2 == 2048
        one_sliding_layer = replace(GPT_OSS_120B, layers=1, sliding_layers=1)
        assert one_sliding_layer.kv_bytes(131_072) == 128 * 2048 == 262_144  # not 268,435,456

    def test_the_whole_model_at_131k_tokens(self):
        # 18 full layers x 2,048 x 131,072 + 18 sliding x 2,048 x 128 = 4,831,838,208 + 4,718,592
        assert GPT_OSS_120B.kv_bytes(131_072) == 4_836_556_800
        assert GPT_OSS_120B.kv_bytes(100) == 100 * 36 * 2048  # inside the window every layer holds it all

    def test_the_cost_model_reads_each_sequence_up_to_its_window(self):
        cost = CostModel.from_parts(H100, GPT_OSS_20B)
        long, short = (1, 100_000), (1, 50)
        expected = GPT_OSS_20B.kv_bytes(100_000) + GPT_OSS_20B.kv_bytes(50)
        read = cost.step_breakdown([long, short]).memory_s * cost.bandwidth - cost.weight_bytes_read(2)
        assert read == pytest.approx(expected)
        assert cost.decode_step_time(4, 100_000) < replace(cost, windowed_kv_bytes_per_token=0.0).decode_step_time(
            4, 100_000
        )

    def test_the_planner_counts_the_capped_cache(self):
        result = plan("h100-sxm", GPT_OSS_120B, 60_000, 1_000)
        assert result.kv_bytes_per_conversation == GPT_OSS_120B.kv_bytes(61_000)
        assert "18 of 36 layers hold 128 at most" in str(result)

    def test_a_window_without_its_layers_is_refused(self):
        with pytest.raises(ValueError, match="sliding_layers"):
            replace(GPT_OSS_120B, sliding_layers=0)


class TestExpertAgainstTensorParallelism:
    def test_deepseek_v3_over_8_gpus_sends_half_as_much(self):
        tensor = tensor_parallel_bytes_per_token_per_layer(7168, 8)
        expert = expert_parallel_bytes_per_token_per_layer(7168, 8, 8)
        assert tensor == 4 * 7 * 7168 * 2 == 401_408
        assert expert == 2 * 8 * 7 / 8 * 7168 * 2 == 200_704
        assert expert / tensor == pytest.approx(8 / (2 * 8))

    def test_mixtral_top_2_sends_an_eighth(self):
        assert expert_parallel_bytes_per_token_per_layer(4096, 8, 2) == 28_672
        assert tensor_parallel_bytes_per_token_per_layer(4096, 8) == 229_376

    def test_one_gpu_sends_nothing(self):
        assert tensor_parallel_bytes_per_token_per_layer(4096, 1) == expert_parallel_bytes_per_token_per_layer(
            4096, 1, 2
        )
        assert tensor_parallel_bytes_per_token_per_layer(4096, 1) == 0


class TestFp8Arithmetic:
    def test_fp8_doubles_the_achievable_rate_on_an_h100(self):
        assert H100.with_compute("fp8").flops == pytest.approx(2 * 494.5e12)
        bf16 = plan("h100-sxm", QWEN3_30B_A3B, 8000, 200)
        fp8 = plan("h100-sxm", QWEN3_30B_A3B, 8000, 200, compute="fp8")
        assert fp8.prefill_s < bf16.prefill_s and fp8.decode_memory_s == bf16.decode_memory_s

    def test_an_a100_has_no_fp8_tensor_cores(self):
        with pytest.raises(ValueError, match="no fp8 tensor cores"):
            plan("a100-80gb", QWEN3_30B_A3B, 1000, 300, compute="fp8")

    def test_an_unknown_precision_is_named(self):
        with pytest.raises(ValueError, match="unknown compute precision 'fp4'"):
            H100.with_compute("fp4")


class TestPlanningTheServedModels:
    @pytest.mark.parametrize("name", sorted(SERVED_MODELS))
    def test_every_preset_plans_by_name_on_a_node_of_h200s(self, name):
        result = plan("h200", name, 2000, 500, tensor_parallel=8)
        assert result.conversations >= 1 and result.experts_touched is not None

    def test_a_conversation_past_the_context_is_refused(self):
        with pytest.raises(ValueError, match="32,768 tokens"):
            plan("h100-sxm", "qwen3-30b-a3b", 40_000, 1_000)

    def test_the_promise_search_agrees_with_the_closed_form_on_a_dense_model(self):
        cost = CostModel.from_parts(H100, MODELS["llama-3.1-8b"], overhead_s=0.003)
        closed = load_within_promise(cost, 0.1, 300, 1150, 0.05)
        kv_s = cost.sequence_kv_bytes(1150) / cost.bandwidth
        searched = _load_by_bisection(cost, 0.1, 300, kv_s, cost.flops_per_token / cost.flops, 0.05)
        assert searched == pytest.approx(closed, rel=1e-9)

    def test_a_mixture_keeps_its_promise_at_the_load_it_is_given(self):
        result = plan("h100-sxm", QWEN3_30B_A3B, 1000, 300, promise_s=0.02)
        assert result.promise_load_per_s < result.request_ceiling_per_s
        assert result.promise_in_flight < result.conversations
        cost = CostModel.from_parts(H100, QWEN3_30B_A3B)
        batch = result.promise_in_flight
        step = max(
            (cost.weight_bytes_read(batch) + batch * QWEN3_30B_A3B.kv_bytes(1150)) / cost.bandwidth,
            batch * cost.flops_per_token / cost.flops,
        )
        assert step == pytest.approx(0.02 * (1 - result.promise_load_per_s * result.prefill_s), rel=1e-6)

    def test_the_table_shows_the_experts_touched(self):
        table = str(plan("h100-sxm", QWEN3_30B_A3B, 1000, 300))
        assert "128 x (1 - (1 - 8/128)^" in table and "bandwidth / active weight bytes" in table

    def test_experts_without_active_parameters_are_refused(self):
        with pytest.raises(ValueError, match="active_parameters"):
            ModelSpec("half a mixture", 30e9, 48, 4, 128, experts=128, experts_per_token=8)

    def test_the_cli_plans_a_mixture_in_fp8(self):
        out = subprocess.run(
            [sys.executable, "-m", "labkit.cli", "plan", "--gpu", "h200", "--model", "deepseek-v3"]
            + ["--tensor-parallel", "8", "--compute", "fp8"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "DeepSeek-V3 on NVIDIA H200 SXM, fp8 arithmetic" in out and "of 256" in out


def test_the_expected_distinct_experts_never_exceed_the_experts():
    assert all(expected_distinct_experts(b, 8, 2) <= 8 for b in (1, 10, 10**6))
    assert math.isclose(expected_distinct_experts(0, 8, 2), 0)


def test_the_simulator_times_a_windowed_mixture_by_each_sequences_capped_read():
    """The simulator's executor hands the cost model every sequence's context, so windows cap each one."""
    from labkit.sim.simulator import blocks_that_fit, simulate
    from labkit.workloads.arrivals import synthetic_workload

    workload = synthetic_workload(6, 50.0, 3000, 20, seed=62)
    cost = CostModel.from_parts(H100, GPT_OSS_20B, 0.003)
    trace = simulate(workload, cost, num_blocks=blocks_that_fit(H100, GPT_OSS_20B))
    decode = next(step for step in trace.steps if step.num_prefill_tokens == 0 and step.num_active > 1)
    per_sequence = [GPT_OSS_20B.kv_bytes(decode.context_tokens / decode.num_active)] * decode.num_active
    assert decode.duration < cost.pass_time(decode.num_active, decode.context_tokens)  # every layer's full read
    assert decode.duration == pytest.approx(
        max(
            (cost.weight_bytes_read(decode.num_active) + sum(per_sequence)) / cost.bandwidth,
            decode.num_active * cost.flops_per_token / cost.flops,
        )
        + 0.003,
        rel=1e-9,  # every context past the 128-token window: the capped read is exact
    )
