"""scripts/kernel_bench.py (what gpu_check.sh runs on a GPU): on any machine, --quick runs the three paths at tiny
shapes (under Triton's interpreter without a GPU), with separate K and V pools and split-KV, and they agree, as do
the engine's tokens with and without the kernel; without a GPU the full run is refused with what to do."""

from __future__ import annotations

import pytest
import torch
from script_loader import load_script

pytestmark = pytest.mark.lab11


def test_the_quick_run_compares_the_three_paths_and_they_agree(tmp_path, capsys):
    script = load_script("kernel_bench")
    result = script.main(["--quick", "--out", str(tmp_path / "rows.json")])
    rows = result["rows"]
    assert result["failures"] == 0, [row.get("error") for row in rows] + [result["engine"].get("error")]
    assert {row["model"] for row in rows} == set(script.SHAPES)
    assert all(row["max_difference"] < 1e-4 for row in rows), [row["max_difference"] for row in rows]
    assert all(row["splits"] >= 2 for row in rows)  # split-KV and its merge, not only the one-program kernel
    assert all(row["bytes"]["gather"] > row["bytes"]["kernel"] > row["bytes"]["sdpa"] > 0 for row in rows)
    assert result["engine"]["tokens_agree"] and result["engine"]["kernel_tokens_per_s"] > 0
    if not torch.cuda.is_available():
        out = capsys.readouterr().out
        assert out.count(script.CPU_LABEL) >= len(rows) + 1  # every row and the engine's line say so
        assert "of peak" not in out and result["card"] is None
    assert (tmp_path / "rows.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the full run is allowed")
def test_without_a_gpu_the_full_run_says_what_to_do(capsys):
    script = load_script("kernel_bench")
    with pytest.raises(SystemExit):
        script.main([])
    assert "run with --quick" in capsys.readouterr().err


FAKE_ROW = {"splits": 2, "max_difference": 0.0}
ENGINE = {"prompts": 1, "max_tokens": 2, "kernel_tokens_per_s": 1.0, "sdpa_tokens_per_s": 2.0, "tokens_agree": True}


def test_a_case_that_fails_is_recorded_and_the_rest_still_run(monkeypatch, capsys):
    script = load_script("kernel_bench")

    def out_of_memory(name, batch, context, *args):
        if name == "Llama-3.1-8B":
            raise RuntimeError("CUDA out of memory")
        return {"model": name, "batch": batch, "context": context, **FAKE_ROW}

    monkeypatch.setattr(script, "one_case", out_of_memory)
    monkeypatch.setattr(script, "describe", lambda row, gpu: "a row")
    monkeypatch.setattr(script, "engine_throughput", lambda *args: ENGINE)
    result = script.main(["--quick"])
    assert result["failures"] == 1 and len(result["rows"]) == len(script.SHAPES)
    assert result["rows"][1]["error"] == "RuntimeError: CUDA out of memory"
    assert "Llama-3.1-8B batch 2 context 40: FAILED: RuntimeError: CUDA out of memory" in capsys.readouterr().out
