"""scripts/kv_tier_bench.py at tiny sizes: it measures reload and recompute at each length, fits the costs lab 12
weighs, and the returning conversations compute fewer prompt tokens with the tier on (counts, not times)."""

from __future__ import annotations

import pytest
from script_loader import load_script

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_quick_run_measures_both_paths_and_the_tier_saves_prompt_tokens(capsys):
    result = load_script("kv_tier_bench").main(["--quick"])
    rows = result["rows"]
    assert [row["tokens"] for row in rows] == [16, 64] and [row["blocks"] for row in rows] == [1, 4]
    assert all(row[key] > 0 for row in rows for key in ("host_s", "disk_s", "recompute_s"))
    costs = result["costs"]
    assert costs.reload_seconds_per_block >= 0 and costs.recompute_seconds_per_token > 0
    assert result["computed"]["on"] < result["computed"]["off"]
    assert len(result["ttft"]["on"]) == len(result["ttft"]["off"]) == 2
    out = capsys.readouterr().out
    assert "crossover, host memory:" in out and "off/on" in out


def test_lengths_that_are_not_whole_blocks_are_refused(capsys):
    with pytest.raises(SystemExit):
        load_script("kv_tier_bench").main(["--lengths", "20"])
    assert "whole blocks of 16" in capsys.readouterr().err
