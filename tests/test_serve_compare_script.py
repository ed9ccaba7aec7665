"""scripts/serve_compare.py: its shipped traces load as workloads that ask for the published token counts."""

from __future__ import annotations

import pytest
from script_loader import load_script


@pytest.mark.parametrize("name, requests, output_tokens", [("W1", 32, 1_603), ("W2", 64, 7_340)])
def test_each_trace_is_sent_at_once_with_its_answer_lengths(name, requests, output_tokens):
    script = load_script("serve_compare")
    workload = script.trace_workload(script.WORKLOADS[name], name)
    assert len(workload) == requests
    assert sum(spec.output_len for spec in workload) == output_tokens
    assert {spec.arrival_time for spec in workload} == {0.0}
    assert all(isinstance(spec.prompt, list) and spec.prompt[-1]["role"] == "user" for spec in workload)


def test_nothing_to_compare_is_an_error_that_says_what_to_give(monkeypatch, capsys):
    script = load_script("serve_compare")
    monkeypatch.setattr("sys.argv", ["serve_compare.py"])
    with pytest.raises(SystemExit):
        script.main()
    assert "give --labkit and/or --url NAME=URL" in capsys.readouterr().err


def test_serve_overhead_runs_the_offline_engine_on_the_traces_own_lengths():
    """scripts/serve_overhead.py's offline side: greedy, ignore_eos, each request its own max_new_tokens."""
    from test_serve import chat_model, make_llm

    overhead = load_script("serve_overhead")
    workload = overhead.trace_workload(overhead.WORKLOADS["W1"], "W1")[:3]
    _, tokens = overhead.offline_tokens_per_second(make_llm(chat_model()), workload)
    assert tokens == sum(spec.output_len for spec in workload)
