"""scripts/quant_bench.py (what gpu_check.sh runs on a GPU): one row per scheme, fewer bytes each, a step time per batch."""

from __future__ import annotations

import torch
from script_loader import load_script

from labkit.models import tiny_model


def test_each_scheme_has_its_bytes_and_a_step_time_per_batch():
    script = load_script("quant_bench")
    bf16 = {"bf16 compute": tiny_model("llama", seed=3, dtype=torch.bfloat16)}
    rows = script.measure(
        tiny_model("llama", seed=3), batches=(1, 2), context=12, repeats=2, prompts=0, n_tokens=4, others=bf16
    )
    assert [row["scheme"] for row in rows] == ["as loaded", "int8", "int4", "bf16 compute"]
    loaded, int8, int4, half = (row["weight bytes"] for row in rows)
    assert int4 < int8 < loaded and half == loaded // 2
    assert all(set(row["step ms"]) == {1, 2} and min(row["step ms"].values()) > 0 for row in rows)
    table = script.format_rows(rows)
    assert "(reference)" in table.splitlines()[2] and "| int4 |" in table
