"""The prepacked linear: same numbers as F.linear where the CPU can run it, a plain fallback where not."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from labkit.models import fast_linear
from labkit.models.fast_linear import matmul_path, prepacked_linear, probe_prepack

CPU = torch.device("cpu")


@pytest.fixture
def fresh_probe(monkeypatch):
    """Forget what this process learnt about the packed kernels, for one test."""
    monkeypatch.setattr(fast_linear, "_probed", {})


def linear_for(path: str, weight, bias):
    if path == "prepacked":
        probed = probe_prepack(CPU, weight.dtype)
        if not probed.prepacked:
            pytest.skip(f"the prepacked path cannot run for {weight.dtype} on this CPU: {probed.reason}")
    return prepacked_linear(weight, bias, enabled=path == "prepacked")


@pytest.mark.parametrize("path", ["prepacked", "plain"])
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 0.1)])
@pytest.mark.parametrize("rows", [0, 1, 7, 64, 300])
def test_prepacked_linear_equals_f_linear(path, dtype, tolerance, rows):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=generator).to(dtype)
    bias = torch.randn(96, generator=generator).to(dtype)
    x = torch.randn(rows, 64, generator=generator).to(dtype)
    for b in (None, bias):
        got = linear_for(path, weight, b)(x)
        expected = F.linear(x, weight, b)
        assert got.shape == expected.shape and got.dtype == dtype
        torch.testing.assert_close(got.float(), expected.float(), atol=tolerance, rtol=1e-3)


def test_views_of_a_fused_weight_and_batched_inputs_work():
    fused = torch.randn(160, 32)
    part = fused[32:96]  # like the q/k/v and gate/up views the model keeps
    x = torch.randn(2, 5, 32)[:, ::2]  # not contiguous
    torch.testing.assert_close(prepacked_linear(part)(x), F.linear(x, part), atol=1e-4, rtol=1e-4)


def test_it_falls_back_to_f_linear_when_switched_off_or_for_other_dtypes(monkeypatch):
    weight = torch.randn(8, 4, dtype=torch.float64)
    assert not matmul_path(weight.device, weight.dtype).prepacked
    assert "float64" in probe_prepack(CPU, torch.float64).reason
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.equal(prepacked_linear(weight)(x), F.linear(x, weight))
    monkeypatch.setenv("LABKIT_PREPACK", "0")
    assert matmul_path(CPU, torch.float32) == fast_linear.MatmulPath(False, "LABKIT_PREPACK=0")
    weight32 = torch.randn(8, 4)
    assert torch.equal(prepacked_linear(weight32)(x.float()), F.linear(x.float(), weight32))


def test_a_kernel_that_refuses_this_cpu_means_the_plain_path(monkeypatch, fresh_probe):
    calls = []

    def refuse(weight, rows):
        calls.append(weight.dtype)
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert\nmore")

    monkeypatch.setattr(fast_linear, "_reorder_weight", refuse)
    path = probe_prepack(CPU, torch.bfloat16)
    assert not path.prepacked and "avx_ne_convert" in path.reason and "more" not in path.reason
    assert path.describe().startswith("plain F.linear (oneDNN refused bfloat16")
    assert not matmul_path(CPU, torch.bfloat16).prepacked
    assert calls == [torch.bfloat16]  # tried once, then remembered for the process


def test_a_kernel_that_gives_wrong_numbers_means_the_plain_path(monkeypatch, fresh_probe):
    monkeypatch.setattr(fast_linear, "_packed_product", lambda x, packed, bias: torch.zeros(len(x), 48))
    path = probe_prepack(CPU, torch.float32)
    assert not path.prepacked and "differs from F.linear" in path.reason


def test_bf16_runs_where_onednn_has_no_bf16_kernels():
    # ONEDNN_MAX_CPU_ISA=AVX2 makes oneDNN act as on a CPU without AVX-512 (most AMD before
    # Zen 4, many laptops): its bf16 packing refuses, and labkit must still run, on F.linear.
    script = (
        "import torch\n"
        "from labkit.models import tiny_model\n"
        "model = tiny_model(dtype=torch.bfloat16)\n"
        "logits, cache = model.prefill(torch.arange(5, 20))\n"
        "assert torch.isfinite(logits).all() and cache.length == 15\n"
        "print(model.prepacked, model.matmul.describe())\n"
    )
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    prepacked, _, description = result.stdout.strip().partition(" ")
    assert prepacked in ("True", "False")
    if prepacked == "False":
        assert description.startswith("plain F.linear (") and len(description) > 20


def test_the_torch_build_in_use_has_the_packed_kernels():
    # The CPU speed targets rely on them; if a torch upgrade drops them the fallback keeps labkit
    # correct, and this test says why it got slower. Whether this CPU can run them is the probe's job.
    assert torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"), (
        "torch.ops.mkldnn._reorder_linear_weight/_linear_pointwise are missing from this torch build; "
        "labkit falls back to F.linear (correct, slower)"
    )


def test_a_model_too_big_for_a_second_copy_is_not_packed(monkeypatch):
    from labkit.models import tiny_model

    here = matmul_path(CPU, torch.float32)
    if not here.prepacked:
        pytest.skip(f"the prepacked path cannot run here: {here.reason}")
    assert tiny_model().prepacked
    assert not tiny_model(prepack=False).prepacked
    monkeypatch.setattr(fast_linear, "available_ram_bytes", lambda: 1000)
    assert not matmul_path(CPU, torch.float32, weight_bytes=600).prepacked
    assert matmul_path(CPU, torch.float32, weight_bytes=400).prepacked
    model = tiny_model()
    assert not model.prepacked and "half the free RAM" in model.matmul.reason
    ids = torch.tensor([1, 2, 3])
    logits = model.forward(ids, torch.arange(3), lambda layer, q, k, v: q)  # any attend: runs on F.linear
    assert logits.shape == (3, model.config.vocab_size)
