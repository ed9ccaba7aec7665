"""scripts/fusion_profile.py: the separate matmuls compute what the fused ones do, both ways are profiled in turns."""

from __future__ import annotations

import torch
from script_loader import load_script

from labkit.models import tiny_model


def test_separate_matmuls_match_the_fused_ones_and_the_model_gets_its_own_back():
    script = load_script("fusion_profile")
    model = tiny_model("qwen2", seed=5)  # q/k/v with biases
    fused = [(layer.qkv, layer.gate_up) for layer in model.layers]
    h = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    for (qkv, gate_up), layer in zip(script.separate_matmuls(model), model.layers):
        torch.testing.assert_close(qkv(h), layer.qkv(h))
        torch.testing.assert_close(gate_up(h), layer.gate_up(h))
    results = script.measure(model, batches=(1, 2), context=12, rounds=2, repeats=2, bandwidth=1e9)
    assert [(layer.qkv, layer.gate_up) for layer in model.layers] == fused
    for way in script.WAYS:
        assert {batch: len(profiles) for batch, profiles in results[way].items()} == {1: 2, 2: 2}
    table = script.format_rows(results).splitlines()
    assert table[0].startswith("| batch | step | linear layers") and len(table) == 2 + 2
    assert table[2].startswith("| 1 | ") and " -> " in table[2]
