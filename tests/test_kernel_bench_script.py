"""scripts/kernel_bench.py (what gpu_check.sh runs on a GPU): on any machine, --quick runs the three paths at tiny
shapes under Triton's interpreter, and they agree; without a GPU the full run is refused with what to do."""

from __future__ import annotations

import pytest
from script_loader import load_script

pytestmark = pytest.mark.lab11


def test_the_quick_run_compares_the_three_paths_and_they_agree(tmp_path, capsys):
    script = load_script("kernel_bench")
    result = script.main(["--quick", "--out", str(tmp_path / "rows.json")])
    rows = result["rows"]
    assert {row["model"] for row in rows} == set(script.SHAPES) and len(rows) == 2 * len(script.SHAPES)
    assert all(row["max_difference"] < 1e-4 for row in rows), [row["max_difference"] for row in rows]
    assert all(row["bytes"]["gather"] > row["bytes"]["kernel"] > 0 for row in rows)
    assert "[interpreter: correctness only]" in capsys.readouterr().out
    assert (tmp_path / "rows.json").exists()


def test_without_a_gpu_the_full_run_says_what_to_do(capsys):
    script = load_script("kernel_bench")
    with pytest.raises(SystemExit):
        script.main([])
    assert "run with --quick" in capsys.readouterr().err
