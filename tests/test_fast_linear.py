"""The prepacked linear: same numbers as F.linear, for every shape the model feeds it, or a plain fallback."""

import pytest
import torch
import torch.nn.functional as F

from labkit.models.fast_linear import prepack_enabled, prepacked_linear


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 0.1)])
@pytest.mark.parametrize("rows", [0, 1, 7, 64, 300])
def test_prepacked_linear_equals_f_linear(dtype, tolerance, rows):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=generator).to(dtype)
    bias = torch.randn(96, generator=generator).to(dtype)
    x = torch.randn(rows, 64, generator=generator).to(dtype)
    for b in (None, bias):
        got = prepacked_linear(weight, b)(x)
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
    assert not prepack_enabled(weight.device, weight.dtype)
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.equal(prepacked_linear(weight)(x), F.linear(x, weight))
    monkeypatch.setenv("LABKIT_PREPACK", "0")
    assert not prepack_enabled(torch.device("cpu"), torch.float32)
    weight32 = torch.randn(8, 4)
    assert torch.equal(prepacked_linear(weight32)(x.float()), F.linear(x.float(), weight32))


def test_the_cpu_build_in_use_has_the_packed_kernels():
    # The CPU speed targets rely on them; if a torch upgrade drops them the fallback keeps labkit
    # correct, and this test says why it got slower.
    assert prepack_enabled(torch.device("cpu"), torch.float32), (
        "torch.ops.mkldnn._reorder_linear_weight/_linear_pointwise are missing from this torch build; "
        "labkit falls back to F.linear (correct, slower)")


def test_a_model_too_big_for_a_second_copy_is_not_packed(monkeypatch):
    from labkit.models import fast_linear, tiny_model

    assert tiny_model().prepacked
    monkeypatch.setattr(fast_linear, "available_ram_bytes", lambda: 1000)
    assert not prepack_enabled(torch.device("cpu"), torch.float32, weight_bytes=600)
    assert prepack_enabled(torch.device("cpu"), torch.float32, weight_bytes=400)
    model = tiny_model()
    assert not model.prepacked  # the tiny model's weights are far above 500 bytes
    ids = torch.tensor([1, 2, 3])
    logits = model.forward(ids, torch.arange(3), lambda layer, q, k, v: q)  # any attend: runs on F.linear
    assert logits.shape == (3, model.config.vocab_size)
