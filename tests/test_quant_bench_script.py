"""scripts/quant_bench.py (what gpu_check.sh runs on a GPU): one row per scheme, fewer bytes each, a step time per batch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from labkit.models import tiny_model

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "quant_bench.py"


def test_each_scheme_has_its_bytes_and_a_step_time_per_batch():
    spec = importlib.util.spec_from_file_location("quant_bench", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rows = script.measure(tiny_model("llama", seed=3), batches=(1, 2), context=12, repeats=2, prompts=0, n_tokens=4)
    assert [row["scheme"] for row in rows] == ["as loaded", "int8", "int4"]
    loaded, int8, int4 = (row["weight bytes"] for row in rows)
    assert int4 < int8 < loaded
    assert all(set(row["step ms"]) == {1, 2} and min(row["step ms"].values()) > 0 for row in rows)
    table = script.format_rows(rows)
    assert "(reference)" in table.splitlines()[2] and "| int4 |" in table
