"""scripts/quant_bench.py (what gpu_check.sh runs on a GPU): one row per scheme, fewer bytes each, tok/s per batch."""

from __future__ import annotations

import pytest
import torch
from script_loader import load_script

from labkit.models import tiny_model


def test_each_scheme_has_its_bytes_and_a_step_time_per_batch():
    script = load_script("quant_bench")
    model = tiny_model("llama", seed=3)
    others = {"bf16 compute": tiny_model("llama", seed=3, dtype=torch.bfloat16), **script.w8a8_rows(model)}
    rows = script.measure(model, batches=(1, 2), context=12, repeats=2, prompts=0, n_tokens=4, others=others, rounds=2)
    names = [row["scheme"] for row in rows]
    assert names[:4] == ["as loaded", "int8", "int4", "bf16 compute"]
    sizes = {row["scheme"]: row["weight bytes"] for row in rows}
    assert sizes["int4"] < sizes["int8"] < sizes["as loaded"] and sizes["bf16 compute"] == sizes["as loaded"] // 2
    if "w8a8" in sizes:  # the tiny model's LM head is its own matrix (untied): in int8 it is smaller too
        assert sizes["w8a8"] < sizes["w8a8, LM head float"] < sizes["as loaded"] / 2
    assert all(set(row["step ms"]) == {1, 2} and min(row["step ms"].values()) > 0 for row in rows)
    table = script.format_rows(rows).splitlines()
    assert "(reference)" in table[2] and "(1.00x)" in table[2] and "tok/s, batch 2" in table[0]
    assert any(line.startswith("| int4 |") for line in table)
    assert all("(reference)" not in line for line in table[3:])  # no quality measured: a dash, not "reference"


def test_the_speed_columns_are_tokens_per_second_with_the_ratio_to_the_model_as_loaded():
    script = load_script("quant_bench")
    rows = [
        {"scheme": "as loaded", "weight bytes": 4e6, "step ms": {1: 10.0, 8: 20.0}},
        {
            "scheme": "w8a8",
            "weight bytes": 1e6,
            "step ms": {1: 5.0, 8: 40.0},
            "greedy agreement": 0.9,
            "mean KL nats": 0.03,
        },
    ]
    line = script.format_rows(rows).splitlines()[3]
    assert line == "| w8a8 | 1.0 | 200 (2.00x) | 200 (0.50x) | 90.0% | 0.0300 |"
    with pytest.raises(KeyError):  # a row timed at other batch sizes than the reference is a mistake, not a blank
        script.format_rows([rows[0], {**rows[1], "step ms": {1: 5.0}}])
