"""``labkit loadtest`` against ``labkit serve`` on loopback: nothing lost, failures counted, sweeps judged.

The server is the tiny model behind the default tokenizer (see test_serve.py), started and
stopped by the fixtures here.
"""

import asyncio
import json
import subprocess
import sys
from dataclasses import replace

import pytest
from test_serve import chat_model, make_llm, scrape, slow_attention

from labkit.cli import main
from labkit.metrics import Distribution, summarize
from labkit.serve.loadtest import api_base, best_rate, recording, run_load
from labkit.serve.server import ServerThread
from labkit.slo import Promise
from labkit.workloads import make_workload


@pytest.fixture(scope="module")
def model():
    return chat_model()


@pytest.fixture(scope="module")
def server(model):
    with ServerThread(make_llm(model, max_num_seqs=16)) as running:
        yield running


def test_a_short_loadtest_loses_nothing_and_agrees_with_the_server(server, tmp_path, capsys):
    before = scrape(server.url)
    result_file = tmp_path / "result.json"
    code = main(
        [
            "loadtest",
            server.url,
            "--num-prompts",
            "12",
            "--request-rate",
            "20",
            "--max-output-tokens",
            "16",
            "--goodput",
            "ttft:60000",
            "tpot:60000",
            "--result-file",
            str(result_file),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "Serving Benchmark Result" in printed and "P99 TPOT (ms):" in printed
    run = json.loads(result_file.read_text())["runs"][0]
    assert (run["num_requests"], run["completed"], run["rejected"], run["unfinished"]) == (12, 12, 0, 0)
    assert run["request_goodput"] == pytest.approx(run["request_throughput"])  # limits no one could miss
    after = scrape(server.url)
    # what the client counted from the usage fields is what the server's counters say it served
    assert run["total_output_tokens"] == after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert run["total_input_tokens"] == after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"]


def test_refused_requests_count_as_failed_never_as_served(model, capsys):
    llm = make_llm(model, max_num_seqs=1, attention=slow_attention)  # each answer takes a while
    with ServerThread(llm, max_waiting=1) as server:
        code = main(
            ["loadtest", server.url, "--num-prompts", "8", "--max-output-tokens", "32", "--ignore-eos", "--json"]
        )
    run = json.loads(capsys.readouterr().out)["runs"][0]
    assert code == 1  # a run that lost requests says so in its exit code
    assert run["rejected"] > 0 and run["completed"] + run["rejected"] == 8
    assert all("503" in error or "queue" in error for error in run["errors"])


def test_a_sweep_finds_the_highest_rate_within_the_promise(server):
    summaries = {}
    for rate in (5.0, 40.0):
        workload = make_workload("random", 6, rate, seed=1, input_len=16, output_len=8)
        trace, errors = asyncio.run(run_load(api_base(server.url), workload, "tiny-llama", ignore_eos=True))
        assert errors == []
        summaries[rate] = summarize(trace)
        assert summaries[rate].total_output_tokens == 6 * 8
    # the load tester's summaries, judged by labkit.slo's rule (whose own cases are in test_slo.py)
    assert best_rate(summaries, Promise(tpot_ms=1e9)) == 40.0
    assert best_rate(summaries, Promise(tpot_ms=1e-9)) is None  # nothing is that fast
    assert best_rate({**summaries, 40.0: replace(summaries[40.0], num_completed=5)}, Promise(1e9)) == 5.0  # one lost
    slow_start = replace(summaries[40.0], ttft_ms=Distribution(summaries[40.0].ttft_ms.values + 10_000.0))
    assert best_rate({5.0: summaries[5.0], 40.0: slow_start}, Promise(1e9, ttft_ms=9_000.0)) == 5.0
    assert best_rate({5.0: summaries[5.0], 40.0: slow_start}, Promise(1e9)) == 40.0


def test_recording_hands_back_every_load_sent_inside_it_and_none_outside(server):
    def send(rate: float):
        workload = make_workload("random", 2, rate, input_len=8, output_len=3)
        return workload, asyncio.run(run_load(api_base(server.url), workload, "tiny-llama", ignore_eos=True))[0]

    send(1.0)
    with recording() as runs:
        sent = [send(rate) for rate in (50.0, 100.0)]
    send(2.0)
    assert len(runs) == 2 and all(a is c and b is d for (a, b), (c, d) in zip(runs, sent))  # the very objects
    assert [workload.meta["rate"] for workload, _ in runs] == [50.0, 100.0]


def test_urls():
    assert api_base("http://h:1") == api_base("http://h:1/v1/") == "http://h:1/v1"
    with pytest.raises(ValueError, match="scheme"):
        api_base("localhost:8000")
    assert main(["loadtest", "http://127.0.0.1:9", "--request-rate", "fast"]) == 2  # bad input: message, exit 2


def test_the_load_tester_loads_no_torch_and_no_model_code():
    """It runs on any client machine: the workloads, the metrics and the openai client, nothing more."""
    script = "import sys, labkit.serve.loadtest_cli\nprint(' '.join(sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert "labkit.metrics" in loaded and "labkit.workloads" in loaded
    assert not [name for name in loaded if name == "torch" or name.startswith(("torch.", "labkit.models"))]


def test_the_sweep_command_reports_the_best_rate_and_draws_it(server, tmp_path, capsys):
    plot = tmp_path / "sweep.png"
    argv = [
        "loadtest",
        server.url,
        "--dataset",
        "random",
        "--num-prompts",
        "4",
        "--random-input-len",
        "8",
        "--random-output-len",
        "4",
        "--ignore-eos",
        "--request-rate",
        "10,20",
        "--promise-ms",
        "1e9",
    ]
    assert main([*argv, "--plot", str(plot), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [run["request_rate"] for run in result["runs"]] == [10.0, 20.0] and result["best_rate"] == 20.0
    assert plot.stat().st_size > 0
    assert main([*argv, "--ttft-promise-ms", "1e-9"]) == 0  # no first token is that fast
    assert "p99 TTFT <= 1e-09 ms, p99 TPOT <= 1e+09 ms and nothing lost: none of these" in capsys.readouterr().out
    assert main([*argv[:-4], "--plot", str(plot)]) == 2  # one rate is no curve: refused with a message
    assert "--plot draws latency against rate" in capsys.readouterr().err
