"""Every benchmark script the README names runs: a small run of each, so none rots between the times it is used."""

from __future__ import annotations

import pytest
from script_loader import load_script

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_simulator_speed_script_simulates_and_says_how_long(capsys):
    seconds = load_script("sim_speed").main(["--requests", "200"])
    assert seconds > 0 and "200 requests simulated in" in capsys.readouterr().out


def test_the_prefix_cache_bench_serves_both_ways_and_finds_a_resent_history_in_the_cache(capsys):
    load_script("prefix_cache_bench").main(
        ["--requests", "3", "--system-tokens", "64", "--max-tokens", "2", "--conversations", "1", "--turns", "2"]
    )
    out = capsys.readouterr().out
    assert "| on |" in out and "| off |" in out and "fewer" in out
    second_turn = next(line for line in out.splitlines() if line.startswith("| 2 | 1 |"))
    hits = int(second_turn.split("|")[4])
    assert hits > 0, out  # turn 2 resends turn 1's prompt and reply: its blocks are found, not computed again


def test_the_speculation_bench_keeps_greedy_answers_the_same_for_every_k(capsys):
    load_script("spec_bench").main(["--max-tokens", "4", "--batches", "2", "--prompts", "1"])
    out = capsys.readouterr().out
    assert "Part 2" in out and "(answers differ!)" not in out
    assert " NO\n" not in out, out  # greedy: speculation may change the speed, never the answer
