"""The capacity planner reproduces the sources' worked examples, to the precision they quote."""

from dataclasses import replace

import pytest

from labkit.capacity import (
    FRIENDS_EXAMPLE,
    FRIENDS_GPU,
    LESSON_LLAMA_8B,
    SALE_EXAMPLE,
    SALE_GPU,
    conversations_that_fit,
    plan,
)
from labkit.cli import main
from labkit.sim import MODELS, CostModel, Hardware

SALE = plan(**SALE_EXAMPLE)
MS = 1e3


class TestSeed000Sale:
    """Every number 'Capacity planning, by hand' quotes (and the 75-token critical batch it points to)."""

    def test_conversations_that_fit(self):
        assert SALE.conversations == 328

    def test_decode_step_with_all_on_board(self):
        assert SALE.mean_context == 1150
        assert round(SALE.kv_read_bytes / SALE.model.weight_bytes) == 3  # KV reads: three times the weights
        assert round(SALE.decode_memory_s * MS, 1) == 32.7
        assert round(SALE.decode_compute_s * MS, 1) == 35.0
        assert round(SALE.decode_step_s * MS, 1) == 38.0

    def test_gpu_time_per_request(self):
        assert round(SALE.decode_s_per_request * MS, 1) == 34.7
        assert round(SALE.gpu_s_per_request * MS, 1) == 144.4
        assert round(4 * SALE.prefill_s / SALE.gpu_s_per_request) == 3  # three quarters on the prompt

    def test_single_stream_and_what_batching_buys(self):
        assert round(SALE.single_stream_tokens_per_s) == 125
        assert round(SALE.speedup_over_single_stream) == 17
        assert round(SALE.critical_batch) == 75

    def test_decode_share_and_token_interval(self):
        assert round(SALE.decode_share, 2) == 0.24
        assert round(SALE.token_interval_s * MS) == 158

    def test_ceiling_and_the_promise(self):
        assert round(SALE.request_ceiling_per_s, 1) == 6.9
        assert round(SALE.promise_load_per_s, 1) == 5.9
        assert round(SALE.promise_in_flight) == 88
        assert round(SALE.promise_capacity_cost, 2) == 0.15

    def test_single_stream_bound_for_14_gb_on_2_tb_per_s(self):
        seven_b = replace(LESSON_LLAMA_8B, parameters=7e9)
        assert round(CostModel.from_parts(SALE_GPU, seven_b).single_stream_bound) == 143

    def test_table_shows_the_terms_separately(self):
        table = str(SALE)
        for text in ("328", "32.7 ms", "35.0 ms", "38.0 ms", "144.4 ms", "6.9 req/s", "5.9 req/s", "24%", "158 ms"):
            assert text in table


class TestSeed002Friends:
    """Seed 002: Llama 3.1 8B at 16 bits on a 24 GB card with about 1 TB/s and 165 TFLOPS."""

    cost = CostModel.from_parts(FRIENDS_GPU, LESSON_LLAMA_8B)

    def test_weights_and_kv_per_token(self):
        assert LESSON_LLAMA_8B.weight_bytes == 16e9
        assert LESSON_LLAMA_8B.kv_bytes_per_token == 128 * 1024
        assert round(8192 * LESSON_LLAMA_8B.kv_bytes_per_token / 1e9) == 1  # an 8K chat: about 1 GB

    def test_four_friends_at_8k_fit_and_ten_do_not(self):
        friends = plan(**FRIENDS_EXAMPLE)
        assert friends.conversations == 4
        at_2k = conversations_that_fit(
            FRIENDS_GPU.memory_bytes, FRIENDS_EXAMPLE["memory_fraction"], LESSON_LLAMA_8B, 2048
        )
        assert at_2k >= 10  # with pages, ten 2K chats fit where four 8K reservations did

    def test_one_person_gets_about_60_tokens_per_second(self):
        assert round(self.cost.single_stream_bound, -1) == 60
        assert round(plan(**FRIENDS_EXAMPLE).critical_batch) == 165

    def test_a_pasted_2000_token_prompt_keeps_the_gpu_busy(self):
        assert self.cost.pass_breakdown(2000, 0).bound == "compute"

    def test_an_8k_document_prefills_in_about_800_ms(self):
        assert round(self.cost.prefill_time(8192) * MS, -2) == 800

    def test_chunked_prefill_stretches_the_step_from_18_to_26_ms(self):
        nine_decodes = [(1, 2048)] * 9
        assert round(self.cost.step_time(nine_decodes) * MS) == 18
        with_chunk = nine_decodes + [(256, 4096)]  # a 256-token chunk of the document rides along
        assert round(self.cost.step_time(with_chunk) * MS) == 26

    def test_ten_friends_at_2k_get_54_tokens_per_second_each(self):
        step = self.cost.decode_step_time(10, 2048)
        assert round(1 / step) == 54
        assert 8.5 < 10 / step / self.cost.single_stream_bound < 9  # almost nine times the work


class TestPromise:
    def test_the_promise_is_a_fixed_point(self):
        cost = CostModel.from_parts(SALE_GPU, LESSON_LLAMA_8B, SALE_EXAMPLE["overhead_s"])
        load, in_flight = SALE.promise_load_per_s, SALE.promise_in_flight
        step = cost.decode_step_time(in_flight, SALE.mean_context)
        assert step / (1 - load * SALE.prefill_s) == pytest.approx(SALE_EXAMPLE["promise_s"])
        assert in_flight == pytest.approx(load * SALE.answer_len * SALE_EXAMPLE["promise_s"])

    def test_a_loose_promise_costs_nothing(self):
        relaxed = plan(**{**SALE_EXAMPLE, "promise_s": 1.0})
        assert relaxed.promise_load_per_s == relaxed.request_ceiling_per_s
        assert relaxed.promise_in_flight == relaxed.conversations

    def test_a_promise_faster_than_reading_the_weights_is_refused(self):
        with pytest.raises(ValueError, match="no load keeps a promise of 9.0 ms.*promise more"):
            plan(**{**SALE_EXAMPLE, "promise_s": 0.009})


class TestBadInputs:
    def test_weights_larger_than_memory(self):
        seventy_b = replace(MODELS["llama-3.1-8b"], name="70B", parameters=70e9)
        with pytest.raises(ValueError, match="do not fit.*quantize"):
            plan("rtx-4090", seventy_b, 100, 100)

    def test_no_conversation_fits(self):
        with pytest.raises(ValueError, match="not one conversation.*shorten"):
            plan("rtx-4090", "llama-3.1-8b", 100_000, 100)

    @pytest.mark.parametrize("prompt_len, answer_len", [(-1, 10), (10, 0), (10.5, 10)])
    def test_lengths(self, prompt_len, answer_len):
        with pytest.raises(ValueError, match="whole number of tokens"):
            plan("h100-sxm", "llama-3.1-8b", prompt_len, answer_len)

    @pytest.mark.parametrize("fraction", [0, 1.5])
    def test_memory_fraction(self, fraction):
        with pytest.raises(ValueError, match="memory_fraction.*0.9"):
            plan("h100-sxm", "llama-3.1-8b", 100, 100, memory_fraction=fraction)

    def test_zero_bandwidth(self):
        with pytest.raises(ValueError, match="bandwidth must be positive"):
            plan(Hardware("no link", 80e9, 0.0, 1e15), "llama-3.1-8b", 100, 100)

    def test_negative_price(self):
        with pytest.raises(ValueError, match="price_per_gpu_hour"):
            plan("h100-sxm", "llama-3.1-8b", 100, 100, price_per_gpu_hour=-1)


def test_cli_prints_the_plan(capsys):
    assert main(["plan", "--example", "sale"]) == 0
    assert "328" in capsys.readouterr().out
    assert main(["plan", "--gpu", "h100-sxm", "--model", "qwen3-8b", "--price", "3", "--promise-ms", "40"]) == 0
    out = capsys.readouterr().out
    assert "Qwen3 8B on NVIDIA H100 SXM" in out and "$3.00/h" in out


def test_cli_overrides_and_reports_bad_input(capsys):
    assert main(["plan", "--example", "sale", "--tflops", "300"]) == 0
    assert "as changed" in capsys.readouterr().out
    assert main(["plan", "--gpu", "rtx-4090", "--params-b", "70"]) == 2
    assert "do not fit" in capsys.readouterr().err


class TestFewerBytes:
    """--weights int4 --kv fp8 on the sale, every figure worked out by hand."""

    plan = staticmethod(lambda **changes: plan(**{**SALE_EXAMPLE, **changes}))

    def test_int4_weights_and_fp8_kv_move_every_row(self):
        from labkit.capacity import with_precision

        small = self.plan(model=with_precision(LESSON_LLAMA_8B, weights="int4", kv="fp8"))
        assert small.model.weight_bytes == 8e9 * 0.52  # 4.16 GB
        assert small.model.kv_bytes_per_token == 2 * 32 * 8 * 128 * 1  # 64 KiB
        assert small.conversations == int((72e9 - 4.16e9) // (1300 * 65536)) == 796
        assert round(small.decode_memory_s * MS, 1) == round((4.16e9 + 796 * 1150 * 65536) / 2e12 * MS, 1) == 32.1
        assert round(small.decode_compute_s * MS, 1) == round(796 * 16e9 / 150e12 * MS, 1) == 84.9
        assert round(small.single_stream_tokens_per_s, 1) == 480.8
        assert small.tokens_per_s > SALE.tokens_per_s and small.cost_per_million_tokens < SALE.cost_per_million_tokens

    def test_fp8_kv_alone_doubles_what_fits(self):
        from labkit.capacity import with_precision

        fp8 = self.plan(model=with_precision(LESSON_LLAMA_8B, kv="fp8"))
        assert fp8.conversations == int((72e9 - 16e9) // (1300 * 65536)) == 657

    def test_unknown_precision_names_the_choices(self):
        from labkit.capacity import with_precision

        with pytest.raises(ValueError, match="int4"):
            with_precision(LESSON_LLAMA_8B, weights="int3")

    def test_cli_flags_change_the_plan(self, capsys):
        main(["plan", "--example", "sale", "--weights", "int4", "--kv", "fp8"])
        table = capsys.readouterr().out
        assert "796" in table and "64 KiB" in table and "480.8 tok/s" in table
