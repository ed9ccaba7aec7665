"""One `labkit` command: one way to fail (message and fix on stderr, exit 2, no traceback), and --json.

The subcommands that need a model get the session's default model instead of loading their
own (``load_model`` is swapped), so these tests cost seconds.
"""

import json
import subprocess
import sys

import pytest

import labkit.models
from labkit.cli import main
from labkit.sim.calibrate import Calibration
from labkit.sim.cost_model import CostModel


@pytest.fixture
def course_model(monkeypatch, default_model):
    monkeypatch.setattr(labkit.models, "load_model", lambda *args, **kwargs: default_model)
    return default_model


def test_bad_input_is_one_message_with_its_fix_on_stderr_and_exit_2(capsys):
    assert main(["plan", "--gpu", "no-such-gpu"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("labkit plan: error: unknown hardware 'no-such-gpu'; use one of")
    assert "Traceback" not in err and "--debug" in err


@pytest.mark.parametrize(
    "argv", [["--debug", "plan", "--gpu", "no-such-gpu"], ["plan", "--gpu", "no-such-gpu", "--debug"]]
)
def test_debug_shows_the_traceback(argv):
    with pytest.raises(ValueError, match="unknown hardware"):
        main(argv)


def test_plan_json_has_every_figure(capsys):
    assert main(["plan", "--example", "sale", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["conversations"] == 328 and result["hardware"]["name"] and result["model"]["layers"] == 32
    assert result["tokens_per_s"] > 0 and "speedup_over_single_stream" in result


def test_info_json(course_model, capsys):
    assert main(["info", "--bandwidth", "100", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["KV bytes per token"] == course_model.config.kv_bytes_per_token(course_model.dtype)
    assert facts["single-stream decode bound (tokens/s)"] == pytest.approx(100e9 / course_model.weight_bytes())
    assert "matmuls" in facts


def test_calibrate_json_and_its_input_errors(course_model, tmp_path, capsys):
    cost = CostModel(
        bandwidth=10e9, flops=50e9, weight_bytes=5e8, overhead_s=0.002, kv_bytes_per_token=46080, flops_per_token=2.7e8
    )
    path = Calibration("here", "cpu", "SmolLM2", "float32", vars(cost), 40, 3.0).save(tmp_path / "fit.json")
    assert main(["calibrate", "--load", "--path", str(path), "--skip-check", "--json"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["calibration"]["cost"] == vars(cost) and result["path"] == str(path) and "check" not in result
    assert f"loaded {path}" in err  # progress goes to stderr, so stdout stays one JSON document
    assert main(["calibrate", "--requests", "1"]) == 2
    assert "need at least 2 requests" in capsys.readouterr().err
    assert main(["calibrate", "--load", "--path", str(tmp_path / "missing.json")]) == 2
    assert "run `labkit calibrate` on this machine first" in capsys.readouterr().err


def test_python_m_labkit_cli_and_top_level_help():
    run = [sys.executable, "-m", "labkit.cli"]
    plan = subprocess.run(run + ["plan", "--example", "sale", "--json"], capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0 and json.loads(plan.stdout)["conversations"] == 328
    usage = subprocess.run(run + ["--help"], capture_output=True, text=True, timeout=120)
    for name in ("info", "plan", "bench", "calibrate", "make-labs", "grade", "serve", "route", "loadtest"):
        assert name in usage.stdout


def test_bench_json(course_model, capsys):
    argv = ["bench", "--num-prompts", "2", "--max-prompt-tokens", "48", "--max-output-tokens", "3", "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    results = json.loads(out)
    assert len(results["serving"]) == 5 and all(row["completed"] == 2 for row in results["serving"].values())
    assert "running (a)" in err


def test_plan_speculate_shows_the_speedup_by_batch_and_where_it_stops(capsys):
    assert main(["plan", "--gpu", "h100-sxm", "--speculate", "4", "--acceptance", "0.5", "--prompt", "200"]) == 0
    out = capsys.readouterr().out
    assert "speed-up" in out and "speculation stops paying at a batch of" in out
    assert main(["plan", "--gpu", "h100-sxm", "--speculate", "4", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)["speculation"]
    assert figures["points"][0]["batch_size"] == 1 and figures["points"][0]["speedup"] > 1
