"""`labkit serve`'s dtype: bf16 only where it was tried, matched fp32 and measured faster (once, kept); fp32 elsewhere."""

from __future__ import annotations

import pytest
import torch

from labkit import kept_measurements
from labkit.engine import decode_timing
from labkit.models import tiny_model
from labkit.models.fast_linear import MatmulPath, prepacked_linear, probe_prepack
from labkit.serve import dtype as serving_dtype
from labkit.serve.dtype import MIN_SPEEDUP, choose_serving_dtype

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def kept_file(tmp_path, monkeypatch):
    """Each test keeps its measurements in a file of its own."""
    path = tmp_path / kept_measurements.FILE_NAME
    monkeypatch.setattr(kept_measurements, "kept_path", lambda: path)
    return path


def with_probe(monkeypatch, works: bool) -> None:
    path = MatmulPath(works, "tried" if works else "oneDNN refused bfloat16 on this CPU: needs avx512bw")
    monkeypatch.setattr(serving_dtype, "probe_prepack", lambda device, dtype: path)


def test_a_cpu_without_a_working_bf16_matmul_serves_in_fp32_and_says_why(monkeypatch):
    monkeypatch.delenv("LABKIT_DTYPE", raising=False)
    with_probe(monkeypatch, works=False)
    choice = choose_serving_dtype(CPU, speedup=lambda: 10.0)
    assert choice.dtype == torch.float32 and "refused bfloat16" in choice.describe()


def test_bf16_is_chosen_only_when_it_is_measured_faster(monkeypatch):
    monkeypatch.delenv("LABKIT_DTYPE", raising=False)
    with_probe(monkeypatch, works=True)
    fast = choose_serving_dtype(CPU, speedup=lambda: 4.2)
    assert fast.dtype == torch.bfloat16 and "4.20x" in fast.reason
    slow = choose_serving_dtype(CPU, speedup=lambda: MIN_SPEEDUP - 0.1, remeasure=True)
    assert slow.dtype == torch.float32 and f"under {MIN_SPEEDUP}x" in slow.reason


def test_two_starts_make_the_same_choice_however_the_second_timing_comes_out(monkeypatch, kept_file):
    monkeypatch.delenv("LABKIT_DTYPE", raising=False)
    with_probe(monkeypatch, works=True)
    timings = iter([0.81, 4.2])  # a busy first start, a quiet second: a race would serve fp32, then bf16
    first = choose_serving_dtype(CPU, speedup=lambda: next(timings))
    written = kept_file.read_text()
    second = choose_serving_dtype(CPU, speedup=lambda: next(timings))
    assert first == second and first.dtype == torch.float32
    assert "0.81x" in second.reason and str(kept_file) in second.reason and "--remeasure" in second.reason
    assert kept_file.read_text() == written  # written once, read back
    redone = choose_serving_dtype(CPU, speedup=lambda: next(timings), remeasure=True)
    assert redone.dtype == torch.bfloat16 and "4.20x" in redone.reason


def test_what_the_user_asks_for_wins(monkeypatch):
    with_probe(monkeypatch, works=True)
    assert choose_serving_dtype(CPU, asked="float32", speedup=lambda: 9.0).dtype == torch.float32
    monkeypatch.setenv("LABKIT_DTYPE", "bf16")
    assert choose_serving_dtype(CPU, speedup=lambda: 0.5).reason == "LABKIT_DTYPE"
    monkeypatch.delenv("LABKIT_DTYPE")
    assert choose_serving_dtype(torch.device("cuda"), speedup=lambda: 0.5).dtype == torch.bfloat16


def test_this_machine_gets_a_dtype_whose_matmuls_are_right(monkeypatch):
    """Whatever this CPU is, the choice is made by trying, and the chosen matmul matches F.linear."""
    monkeypatch.delenv("LABKIT_DTYPE", raising=False)
    choice = choose_serving_dtype(CPU, speedup=lambda: serving_dtype.measured_speedup(tiny, SMALL_BATCHES, steps=2))
    assert choice.reason
    if choice.dtype == torch.bfloat16:
        assert probe_prepack(CPU, torch.bfloat16).prepacked
    weight, x = torch.randn(64, 32), torch.randn(4, 32)
    got = prepacked_linear(weight.to(choice.dtype), enabled=None)(x.to(choice.dtype)).float()
    expected = torch.nn.functional.linear(x, weight)
    tolerance = 1e-4 if choice.dtype == torch.float32 else 3e-2
    assert float((got - expected).abs().max() / expected.abs().max()) < tolerance


def tiny(dtype: torch.dtype):
    return tiny_model(dtype=dtype)


SMALL_BATCHES = ((4, 16), (2, 48))


def test_the_probe_times_decode_steps_of_both_dtypes_and_keeps_the_lower_ratio(monkeypatch):
    """End to end, not one matmul: the engine's own decode steps, for each batch shape; the worse regime decides."""
    timed: list[tuple[str, int, int]] = []

    def fake_decode_ms(model, batch_size, context, repeats):
        timed.append((str(model.dtype), batch_size, context))
        fast_in_bf16 = {(4, 16): 2.0, (2, 48): 0.8}[(batch_size, context)]  # bf16 faster on short chats only
        return fast_in_bf16 if model.dtype == torch.float32 else 1.0

    monkeypatch.setattr(decode_timing, "labkit_decode_ms", fake_decode_ms)
    assert serving_dtype.measured_speedup(tiny, SMALL_BATCHES, steps=2) == pytest.approx(0.8)
    assert sorted(timed) == sorted((str(d), b, c) for d in (torch.float32, torch.bfloat16) for b, c in SMALL_BATCHES)


def test_the_probe_runs_on_this_cpu_whatever_it_is():
    """bf16 may be emulated here (slow): the probe still measures and returns a ratio, never an error."""
    ratio = serving_dtype.measured_speedup(tiny, ((2, 16),), steps=2)
    assert 0 < ratio < float("inf")
