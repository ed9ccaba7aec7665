"""scripts/gpu_check.sh, the one command for a GPU machine: its dry run takes every step on this CPU (tiny shapes,
Triton's interpreter, the CUDA-only tests skipped) and ends with one summary; a step that fails is recorded and the
steps after it still run. So the first GPU session finds no mistake of the script's own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.lab11

ROOT = Path(__file__).resolve().parents[1]
STEPS = (
    "environment",
    "correctness on cpu",
    "lab 11's checks",
    "device walk",
    "kernels compiled",
    "kernel bench",
    "engine throughput",
    "quantized weights",
)


def gpu_check(*args: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    """``bash scripts/gpu_check.sh ARGS`` from the repository root, with ``python`` as its interpreter."""
    env = {**os.environ, "PYTHON": python}
    return subprocess.run(
        ["bash", "scripts/gpu_check.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )


@pytest.fixture
def warm_python():
    """A ``python`` for the script that runs each command in a fork of one that has torch imported already
    (tests/warm_python.py): the same command lines, without starting torch anew for every one of them."""
    with tempfile.TemporaryDirectory() as folder:  # short: a socket's path has a limit of about 100 bytes
        server = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "warm_python.py"), "serve", folder],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout.readline().strip() == "ready", "the warm python did not start"
            yield os.path.join(folder, "python")
        finally:
            server.terminate()  # it waits for what it runs, so their CPU time is counted as this test's
            server.wait(timeout=60)


def summary_of(result: subprocess.CompletedProcess) -> str:
    assert "=== summary" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout[result.stdout.index("=== summary") :]


def test_the_dry_run_takes_every_step_on_the_cpu_and_sums_them_up(tmp_path, warm_python):
    result = gpu_check("--dry-run", str(tmp_path), python=warm_python)
    summary = summary_of(result)
    assert result.returncode == 0, summary + result.stderr[-3000:]
    assert "dry run on the CPU" in summary and "FAILED" not in summary
    assert re.search(r"environment +passed \(\d+ s\)", summary), summary  # each step's time, beside its verdict
    for step in STEPS:
        assert step in summary, f"no {step!r} in the summary:\n{summary}"
    assert "kernel: CPU, interpreter: correctness only, not speed (no share of a peak)" in summary
    assert "tokens/s with the kernel" in summary and "with SDPA" in summary and "greedy tokens agree: True" in summary
    assert (tmp_path / "kernel_bench.json").exists() and (tmp_path / "environment.txt").exists()


def test_a_failed_step_is_recorded_and_the_next_ones_still_run(tmp_path):
    # an interpreter that finds labkit and torch (the script's first question) and fails everything else
    broken = tmp_path / "python"
    broken.write_text(
        "#!/bin/sh\n"
        f'case "$2" in *find_spec*) exec {sys.executable} "$@" ;; esac\n'
        'echo "broken on purpose: $*" >&2; exit 3\n'
    )
    broken.chmod(0o755)
    result = gpu_check("--dry-run", str(tmp_path / "out"), python=str(broken))
    summary = summary_of(result)
    assert result.returncode == 1
    for step in STEPS:
        assert step in summary
    assert summary.count("FAILED (exit 3;") >= len(STEPS) - 2  # the device walk and compiling may be skipped
    assert "some steps FAILED" in summary


def test_without_setup_or_a_gpu_it_says_what_to_do(tmp_path):
    missing = gpu_check("--dry-run", python=str(tmp_path / "no-python"))
    assert missing.returncode == 2 and "run 'make setup' first" in missing.stderr
    unknown = gpu_check("--fast")
    assert unknown.returncode == 2 and "unknown option --fast" in unknown.stderr
    if not torch.cuda.is_available():
        no_gpu = gpu_check(str(tmp_path))
        assert no_gpu.returncode == 2 and "bash scripts/gpu_check.sh --dry-run" in no_gpu.stderr
