"""``quantization="int8"``: int8 x int8 linears on torch's int8 kernels, chosen by trying, batch-invariant per token."""

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from labkit import kept_measurements
from labkit.engine import LLM, decode_timing, int8_choice
from labkit.engine.int8_choice import choose_int8_backend
from labkit.engine.quantization import check_quantization, quantize_for_serving
from labkit.models import int8_linear as int8
from labkit.models import tiny_model
from labkit.models.int8_linear import TOLERANCE, Int8Backend, int8_linear, linear_error
from labkit.models.int8_model import Int8Model
from labkit.sampling import SamplingParams

BACKEND = choose_int8_backend()  # on the engine tests/conftest.py names: not timed
needs_int8 = pytest.mark.skipif(not BACKEND.works, reason=f"no int8 kernel here: {BACKEND.reason}")


@pytest.fixture(autouse=True)
def kept_file(tmp_path, monkeypatch):
    """Each test keeps its timings in a file of its own (the fake engines' timings stay out of labkit's cache)."""
    path = tmp_path / kept_measurements.FILE_NAME
    monkeypatch.setattr(kept_measurements, "kept_path", lambda: path)
    return path


@pytest.fixture
def unpinned(monkeypatch):
    """No engine named in the environment (tests/conftest.py names one for the suite): the choice is timed."""
    monkeypatch.delenv(int8.ENGINE_VARIABLE, raising=False)
    monkeypatch.setattr(
        int8_choice, "try_backend", lambda engine, rr, *dtype: (Int8Backend(engine, rr, engine, *dtype), "")
    )
    monkeypatch.setattr(int8_choice, "bf16_works", lambda: False)  # the fp32 models only, unless a test says


def working_engines() -> list[Int8Backend]:
    engines = [engine for engine in torch.backends.quantized.supported_engines if engine != "none"]
    tried = [int8.try_backend(engine, False)[0] for engine in engines]
    return [backend for backend in tried if backend is not None] or [pytest.param(None, marks=needs_int8)]


@pytest.mark.parametrize("backend", working_engines(), ids=lambda b: getattr(b, "engine", "none"))
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_int8_linear_is_within_the_measured_tolerance_of_fp32(backend, rows):
    # TOLERANCE (0.05 of the product's largest value) was set from 0.010-0.016 measured on such rows
    generator = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(96, 80, generator=generator), torch.randn(96, generator=generator)
    x = torch.randn(rows, 80, generator=generator)
    linear = int8_linear(weight, bias, backend)
    expected = F.linear(x, weight, bias)
    assert float((linear(x) - expected).abs().max() / expected.abs().max()) <= TOLERANCE
    assert linear_error(int8_linear(weight, None, backend), weight, x) <= TOLERANCE
    batched = torch.randn(2, 3, 80, generator=generator).bfloat16()  # any leading shape; the dtype comes back
    assert int8_linear(weight, None, backend)(batched).shape == (2, 3, 96)
    assert int8_linear(weight, None, backend)(batched).dtype == torch.bfloat16


@needs_int8
def test_a_row_gets_the_same_bits_alone_as_beside_any_other_rows():
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(256, 128, generator=generator)
    linear = int8_linear(weight, None, BACKEND)
    x = torch.randn(8, 128, generator=generator)
    loud = x.clone()
    loud[1:] *= 100  # neighbours with a far larger range: a per-batch activation scale would change row 0
    assert torch.equal(linear(x[:1]), linear(loud)[:1]) and torch.equal(linear(x)[3], linear(x[3:4])[0])
    assert torch.equal(linear(torch.zeros(2, 128)), torch.zeros(2, 256))  # an all-zero row divides by no zero


def test_with_no_working_kernel_it_falls_back_and_says_why():
    backend = choose_int8_backend(candidates=lambda: [("no-such-engine", False)], speeds=lambda _: {})
    assert not backend.works and "no int8 kernel works here" in backend.reason and "no-such-engine" in backend.reason
    model = tiny_model("llama", seed=1)
    served, choice = quantize_for_serving(model, "int8", choose_backend=lambda: backend)
    assert served is model and choice.quantization is None
    assert "serving unquantized" in choice.describe() and "no-such-engine" in choice.describe()
    with pytest.raises(ValueError, match="no int8 kernel"):
        int8_linear(torch.ones(4, 4), None, backend)


@needs_int8
def test_a_kernel_off_by_more_than_the_tolerance_is_refused(monkeypatch):
    monkeypatch.setattr(int8, "linear_error", lambda *args: 0.5)  # what a saturating 16-bit sum looks like
    backend = choose_int8_backend(candidates=lambda: [(BACKEND.engine, False)], speeds=lambda _: {})
    assert not backend.works and "off by 0.50" in backend.reason


def test_the_engine_whose_decode_steps_are_fastest_is_chosen_and_its_speed_stated(unpinned):
    speeds = {"slow": 0.5, "fast": 1.25}  # fp32's decode-step time over each engine's
    backend = choose_int8_backend(candidates=lambda: [("slow", False), ("fast", False)], speeds=lambda _: speeds)
    assert backend.engine == "fast" and "conversations) measured 1.25x fp32's speed" in backend.reason
    assert "also working: slow 0.50x" in backend.reason and "not time" not in backend.reason


def test_the_start_line_says_when_int8_is_slower_than_fp32_and_int8_still_serves(unpinned):
    speeds = {"qnnpack": 0.66, "x86": 0.61}
    backend = choose_int8_backend(candidates=lambda: [("qnnpack", False), ("x86", True)], speeds=lambda _: speeds)
    served, choice = quantize_for_serving(tiny_model("llama", seed=1), "int8", choose_backend=lambda: backend)
    assert choice.quantization == "int8" and isinstance(served, Int8Model)  # asked for: served, never switched off
    assert "qnnpack int8 kernels" in choice.describe() and "x86 0.61x" in choice.describe()
    assert "measured 0.66x fp32's speed: int8 saves memory, not time, on this CPU" in choice.describe()


def test_a_single_working_engine_is_timed_against_fp32_too(unpinned, kept_file):
    backend = choose_int8_backend(candidates=lambda: [("fbgemm", True)], speeds=lambda _: {"fbgemm": 1.4})
    assert backend.engine == "fbgemm" and "(7-bit activations)" in backend.reason and "1.40x" in backend.reason
    assert "also working" not in backend.reason and kept_file.exists()


def test_two_starts_pick_the_same_kernel_the_kept_one_and_only_remeasure_times_again(unpinned, kept_file):
    engines = lambda: [("x86", False), ("onednn", False)]  # noqa: E731
    first = choose_int8_backend(candidates=engines, speeds=lambda _: {"x86": 1.0, "onednn": 1.43})
    written = kept_file.read_text()
    second = choose_int8_backend(candidates=engines, speeds=lambda _: pytest.fail("timed although one is kept"))
    assert first == second and first.engine == "onednn" and "1.43x fp32's speed" in second.reason
    assert str(kept_file) in second.reason and kept_file.read_text() == written
    redone = choose_int8_backend(candidates=engines, speeds=lambda _: {"x86": 1.2, "onednn": 0.8}, remeasure=True)
    assert redone.engine == "x86" and "1.20x" in redone.reason


def test_a_kept_one_matmul_timing_is_not_taken_for_a_decode_step_one(unpinned, kept_file):
    old = {"value": {"qnnpack": 0.883, "x86": 0.667}, "measured_on": "2026-12-07"}
    content = {"machine": kept_measurements.machine_key(), "measurements": {"int8 kernels' speed over fp32": old}}
    kept_file.write_text(json.dumps(content))
    engines = lambda: [("qnnpack", False), ("x86", True)]  # noqa: E731
    backend = choose_int8_backend(candidates=engines, speeds=lambda _: {"qnnpack": 0.66, "x86": 1.31})
    assert backend.engine == "x86" and "1.31x" in backend.reason
    assert json.loads(kept_file.read_text())["measurements"][int8_choice.MEASUREMENT]["value"]["x86"] == 1.31


@needs_int8
def test_the_probe_times_each_engines_served_model_in_turns_with_fp32(monkeypatch):
    model, in_turns = tiny_model("llama", seed=1), decode_timing.decode_ms_in_turns
    timed = {}

    def fake_in_turns(models, batch_size, context, repeats):
        timed.update(models, shape=(batch_size, context, repeats))
        return {"fp32": 3.0, BACKEND.engine: 2.0 if context == 8 else 1.0}  # 1.5x on the short batch, 3x on the long

    monkeypatch.setattr(decode_timing, "decode_ms_in_turns", fake_in_turns)
    speeds = int8_choice.decode_step_speeds([BACKEND], make_model=lambda: model, batches=((4, 16), (4, 8)), steps=2)
    assert speeds == {BACKEND.engine: 1.5} and timed["fp32"] is model and timed["shape"] == (4, 8, 2)  # the lower
    assert isinstance(timed[BACKEND.engine], Int8Model) and timed[BACKEND.engine].backend == BACKEND
    monkeypatch.setattr(decode_timing, "decode_ms_in_turns", in_turns)  # and for real, on a tiny model: a ratio
    speeds = int8_choice.decode_step_speeds([BACKEND], make_model=lambda: model, batches=((2, 4),), steps=2)
    assert 0 < speeds[BACKEND.engine] < float("inf")


def test_decode_steps_are_timed_in_turns_one_step_of_each_model_then_the_next(monkeypatch):
    stepped = []
    step = LLM.step
    monkeypatch.setattr(LLM, "step", lambda llm: stepped.append(id(llm)) or step(llm))
    times = decode_timing.decode_ms_in_turns(
        {"a": tiny_model("llama", seed=1), "b": tiny_model("llama", seed=2)}, 2, 4, 3
    )
    assert set(times) == {"a", "b"} and all(ms > 0 for ms in times.values())
    first, second = stepped[:2]
    assert first != second and stepped == [first, second] * 4  # the prefill, then 3 decode steps each


@pytest.mark.parametrize("value", ["int4", "fp8", "INT8", ""])
def test_other_quantizations_are_refused_saying_what_is_served(value):
    with pytest.raises(ValueError, match="labkit serves 'int8'") as err:
        check_quantization(value)
    assert ("weight-only" in str(err.value)) == (value == "int4")
    with pytest.raises(ValueError, match="not supported"):
        LLM(tiny_model("llama", seed=1), quantization=value, num_blocks=8)


def greedy_alone_and_in_a_batch(llm: LLM, prompts: list, max_tokens: int) -> tuple[list, list]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    alone = [llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids for prompt in prompts]
    batch = [out.outputs[0].token_ids for out in llm.generate(prompts, params, use_tqdm=False)]
    return alone, batch


@needs_int8
def test_tiny_model_in_int8_gives_a_request_the_same_tokens_alone_and_in_a_batch_of_8():
    model = tiny_model("llama", seed=2)
    llm = LLM(model, quantization="int8", num_blocks=64, max_num_seqs=8)
    assert isinstance(llm.model, Int8Model) and llm.describe()["quantization"] == "int8"
    prompts = [[3 + i, 40 + 7 * i, 9, 100 + i] * (1 + i % 3) for i in range(8)]
    alone, batch = greedy_alone_and_in_a_batch(llm, prompts, 12)
    assert alone == batch
    plain = LLM(model, num_blocks=64).generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True), use_tqdm=False)
    # int8 stays close to fp32: measured, the first 4 tokens of 7 of these 8 agree with 8-bit activations, of 5
    # with the 7-bit ones the kernels of a CPU without VNNI take (AVX2; random weights: near-ties)
    assert sum(a[:4] == p.outputs[0].token_ids[:4] for a, p in zip(alone, plain)) >= 5


@needs_int8
def test_default_model_in_int8_gives_a_request_the_same_tokens_alone_and_in_a_batch_of_8(default_model):
    llm = LLM(default_model, quantization="int8", max_model_len=512, num_blocks=128, max_num_seqs=8)
    prompts = [[{"role": "user", "content": f"Tell me one fact about the number {i}."}] for i in range(8)]
    alone, batch = greedy_alone_and_in_a_batch(llm, prompts, 8)
    assert alone == batch
    assert llm.model.weight_bytes() < default_model.weight_bytes() / 2


def test_where_bf16_works_each_engine_is_timed_again_with_the_rest_in_bf16_and_the_fastest_serves(unpinned):
    timed = []

    def speeds(backends):
        timed.extend(backends)
        return {"onednn": 1.6, "onednn+bf16": 2.1, "fbgemm": 1.5, "fbgemm+bf16": 1.9}

    engines = lambda: [("onednn", False), ("fbgemm", False)]  # noqa: E731
    backend = choose_int8_backend(candidates=engines, speeds=speeds, bf16=lambda: True)
    assert sorted(b.name for b in timed) == ["fbgemm", "fbgemm+bf16", "onednn", "onednn+bf16"]
    assert backend.engine == "onednn" and backend.activations == torch.bfloat16 and backend.name == "onednn+bf16"
    assert "onednn int8 kernels, the rest of the model in bf16" in backend.reason and "2.10x" in backend.reason
    assert "also working: fbgemm 1.50x, fbgemm+bf16 1.90x, onednn 1.60x" in backend.reason


def test_where_bf16_is_slower_or_fails_its_probe_the_rest_stays_in_fp32(unpinned, kept_file):
    engines = lambda: [("onednn", False)]  # noqa: E731
    slower = choose_int8_backend(
        candidates=engines, speeds=lambda _: {"onednn": 1.3, "onednn+bf16": 0.7}, bf16=lambda: True
    )
    assert slower.activations == torch.float32 and "the rest of the model in bf16" not in slower.reason
    assert "also working: onednn+bf16 0.70x" in slower.reason
    timed = []
    kept_file.unlink()
    absent = choose_int8_backend(
        candidates=engines, speeds=lambda b: timed.extend(b) or {"onednn": 1.3}, bf16=lambda: False
    )
    assert [b.name for b in timed] == ["onednn"] and absent.activations == torch.float32


@needs_int8
def test_the_kernels_take_bf16_rows_within_the_tolerance():
    in_bf16, why_not = int8.try_backend(BACKEND.engine, BACKEND.reduce_range, torch.bfloat16)
    assert in_bf16 is not None and in_bf16.activations == torch.bfloat16, why_not
    generator = torch.Generator().manual_seed(3)
    weight, x = torch.randn(96, 80, generator=generator), torch.randn(16, 80, generator=generator)
    assert linear_error(int8_linear(weight, None, in_bf16), weight, x.bfloat16()) <= TOLERANCE
    garbled = lambda rows: int8_linear(weight, None, in_bf16)(rows) * 1.2  # noqa: E731  a wrong product fails
    assert linear_error(garbled, weight, x.bfloat16()) > TOLERANCE


@needs_int8
def test_an_int8_model_with_bf16_around_its_linears_computes_the_rest_in_bf16_close_to_the_fp32_one():
    model = tiny_model("llama", seed=2)
    around = replace(BACKEND, activations=torch.bfloat16)
    fp32_rest, bf16_rest = Int8Model(model, BACKEND), Int8Model(model, around)
    assert fp32_rest.dtype == model.dtype == torch.float32 and bf16_rest.dtype == torch.bfloat16
    assert all(layer.input_norm.dtype == torch.bfloat16 for layer in bf16_rest.layers)
    tied = [m.weights["lm_head.weight"] is m.embed for m in (model, bf16_rest)]
    assert model.embed.dtype == torch.float32 and tied[0] == tied[1]
    assert bf16_rest.weight_bytes() < fp32_rest.weight_bytes()
    prompts = [[3 + i, 40 + 7 * i, 9, 100 + i] * (1 + i % 3) for i in range(8)]
    llms = [LLM(m, num_blocks=64, max_num_seqs=8) for m in (fp32_rest, bf16_rest)]
    assert llms[1].describe()["dtype"] == "torch.bfloat16"
    logits = [
        m.forward(torch.tensor(prompts[7]), torch.arange(len(prompts[7])), lambda i, q, k, v: q)
        for m in (fp32_rest, bf16_rest)
    ]
    # measured here: 0.04 of the largest logit apart (bf16 norms and rows, on top of int8); the same model with its
    # norms skipped was 1.7e6 apart. 0.1 leaves room for another CPU's rounding and still fails a broken model.
    assert float((logits[0] - logits[1]).abs().max() / logits[0].abs().max()) <= 0.1
    alone, batch = greedy_alone_and_in_a_batch(llms[1], prompts, 12)
    assert alone == batch


@needs_int8
def test_an_int8_model_is_not_quantized_twice():
    model = Int8Model(tiny_model("llama", seed=1), BACKEND)
    with pytest.raises(ValueError, match="already computes in int8"):
        Int8Model(model, BACKEND)


def test_labkit_bench_refuses_an_unsupported_quantization_as_serve_does(capsys):
    from labkit.cli import main

    with pytest.raises(SystemExit) as exit_code:
        main(["bench", "--quantization", "int4"])
    assert exit_code.value.code == 2
    err = capsys.readouterr().err
    assert "quantization 'int4' is not supported" in err and "Traceback" not in err


def test_an_engine_named_in_the_environment_is_the_only_one_tried_and_is_not_timed(monkeypatch):
    monkeypatch.delenv(int8.ENGINE_VARIABLE, raising=False)
    engines = sorted({engine for engine, _ in int8.candidate_engines()})
    monkeypatch.setenv(int8.ENGINE_VARIABLE, engines[-1])
    assert {engine for engine, _ in int8.candidate_engines()} == {engines[-1]}
    pinned = choose_int8_backend(candidates=int8.candidate_engines, speeds=lambda _: pytest.fail("timed"))
    assert pinned.works == any(int8.try_backend(engines[-1], bits)[0] is not None for bits in (False, True))
    assert not pinned.works or f"named by {int8.ENGINE_VARIABLE} (not timed)" in pinned.reason
    monkeypatch.setenv(int8.ENGINE_VARIABLE, "no-such-engine")
    with pytest.raises(ValueError, match="LABKIT_INT8_ENGINE='no-such-engine', but this torch's int8 engines are"):
        int8.candidate_engines()
