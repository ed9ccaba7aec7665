"""The benchmark's parts on the tiny model: baselines record honest traces, the sweep and table run."""

import argparse

import pytest

from labkit.bench import BenchRow, format_table
from labkit.bench.decode_sweep import bound_ms, decode_sweep, format_sweep
from labkit.bench.hf_baselines import hf_static_batches
from labkit.metrics import summarize
from labkit.models import tiny_model
from labkit.sim.hardware import Hardware


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=11)


def test_static_batches_hold_slots_until_the_longest_answer(model):
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    lengths = [6, 2, 3, 4]
    trace = hf_static_batches(model, prompts, lengths, batch_size=2, name="hf-2")
    assert [r.output_len for r in trace.requests] == lengths
    # batch 1 runs 6 steps with 2 slots (request 1 idles 4 of them); batch 2 runs 4 (request 2 idles 1)
    assert len(trace.steps) == 6 + 4
    assert all(step.slots_held == 2 for step in trace.steps)
    summary = summarize(trace)
    assert summary.padded_slot_steps == (6 - 2) + (4 - 3)
    assert summary.slot_utilization == pytest.approx(sum(lengths) / (2 * 10))
    first_batch_done = max(trace.requests[0].token_times)
    assert min(trace.requests[2].token_times) > first_batch_done  # the second batch waited


def test_one_at_a_time_has_no_padding_and_growing_ttft(model):
    trace = hf_static_batches(model, [[1, 2, 3]] * 3, [4, 4, 4], batch_size=1, name="hf-1")
    summary = summarize(trace)
    assert summary.padded_slot_steps == 0 and summary.slot_utilization == 1.0
    ttfts = [r.first_token_time for r in trace.requests]
    assert ttfts == sorted(ttfts) and ttfts[0] < ttfts[-1]


def test_decode_sweep_and_table_run(model):
    hardware = Hardware("test", 1e9, bandwidth=1e9, flops=1e12)
    points = decode_sweep(model, hardware, batch_sizes=(1, 4), context=20, repeats=3)
    assert [p.batch_size for p in points] == [1, 4]
    assert all(p.hf_ms > 0 and p.labkit_ms > 0 for p in points)
    assert "labkit/HF" in format_sweep(points)
    weights = model.weight_bytes()
    assert bound_ms(model, hardware, 1, 0) == pytest.approx(1e3 * weights / 1e9)


def test_table_shows_ratios_to_the_first_row(model):
    trace = hf_static_batches(model, [[1, 2]] * 2, [3, 3], batch_size=1, name="hf-1")
    batched = hf_static_batches(model, [[1, 2]] * 2, [3, 3], batch_size=2, name="hf-2")
    table = format_table([BenchRow("(a)", summarize(trace)), BenchRow("(b)", summarize(batched))])
    assert table.splitlines()[2].split()[2] == "1.00"


def test_busy_cores_spin_while_inside_and_are_gone_after():
    from labkit.bench.busy import busy_cores

    with busy_cores(2) as spinners:
        assert len(spinners) == 2 and all(spinner.poll() is None for spinner in spinners)
    assert all(spinner.poll() is not None for spinner in spinners)
    with pytest.raises(ValueError, match="cannot be negative"):
        with busy_cores(-1):
            pass


class CountingTokenizer:
    """Decodes ids as numbers, and counts how many tokens it was asked to decode."""

    def __init__(self):
        self.decoded = 0

    def decode(self, ids, skip_special_tokens=False):
        self.decoded += len(ids)
        return " ".join(map(str, ids))


def test_step_profile_parts_add_up_to_the_step_and_the_model_is_left_as_it_was(model, monkeypatch):
    from labkit.bench.step_profile import PARTS, SERVER_ANSWER_TOKENS, format_profile, step_profile

    tokenizer = CountingTokenizer()
    monkeypatch.setattr(model, "tokenizer", tokenizer)
    profiles = step_profile(model, bandwidth=1e9, batches=(1, 4), context=20, repeats=3)
    assert [p.batch_size for p in profiles] == [1, 4]
    for p in profiles:
        assert set(p.parts_ms) == set(PARTS) and p.step_ms > 0 and p.parts_ms["linear layers"] > 0
        assert sum(p.parts_ms.values()) == pytest.approx(p.step_ms)  # by construction: differences of one run
        kv = p.batch_size * 20 * model.config.kv_bytes_per_token(model.dtype)
        assert p.floor_ms == pytest.approx(1e3 * (model.weight_bytes() + kv) / 1e9)
        assert p.server_ms is not None and p.server_ms > 0
    # the server's part decoded every request's whole answer so far, in each of its 1 + 3 runs
    assert tokenizer.decoded == (1 + 4) * (1 + 3) * SERVER_ANSWER_TOKENS
    assert "forward" not in vars(model)  # the timing wrapper is gone
    table = format_profile(profiles)
    assert "attention" in table and "floor" in table and "server text, events" in table
    monkeypatch.setattr(model, "tokenizer", None)
    assert "no tokenizer" in format_profile(step_profile(model, bandwidth=1e9, batches=(1,), context=20, repeats=1))


def test_the_profile_takes_each_attention_and_kv_cache_in_turns_and_refuses_unknown_ones(model):
    from labkit.bench.step_profile import format_profile, step_profile
    from labkit.cli.bench import add_arguments

    lines = []
    profiles = step_profile(
        model,
        1e9,
        progress=lines.append,
        batches=(2,),
        context=20,
        repeats=2,
        attentions=("gather", "blockwise"),
        kv_cache_dtypes=("auto", "bfloat16"),
    )
    assert [(p.attention, p.kv_cache_dtype) for p in profiles] == [
        ("gather", "auto"),
        ("gather", "bfloat16"),
        ("blockwise", "auto"),
        ("blockwise", "bfloat16"),
    ]
    assert profiles[1].floor_ms < profiles[0].floor_ms  # half the KV bytes to read
    assert "blockwise bfloat16" in format_profile(profiles)
    assert lines == format_profile(profiles).splitlines()[:5]  # the header, then each row as it was measured
    for bad, named in (
        ({"attentions": ("sdpa",)}, "attention sdpa: choose from gather, blockwise"),
        ({"kv_cache_dtypes": ("int4",)}, "kv_cache_dtype int4"),
    ):
        with pytest.raises(ValueError, match=named):
            step_profile(model, 1e9, batches=(1,), context=20, repeats=1, **bad)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--profile", "--attention", "gather, blockwise", "--kv-cache-dtype", "bfloat16", "--profile-batches", "8,32"]
    )
    assert args.attention == ["gather", "blockwise"] and args.kv_cache_dtype == ["bfloat16"]
    assert args.profile_batches == [8, 32]
