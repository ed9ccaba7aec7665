"""scripts/compile_kernels.py: every kernel, labkit's and the solved lab 11 notebook's, compiles for an A100 and an
H100 with Triton's own compiler on this machine (no GPU), and the table names each one's registers and spills."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from script_loader import load_script

from labkit.kernels.compile_for_gpu import TARGETS, compiler_problem

pytestmark = pytest.mark.lab11


def test_every_kernel_compiles_for_both_gpu_targets(capsys):
    problem = compiler_problem()
    if problem:
        pytest.skip(problem)
    rows = load_script("compile_kernels").main([])
    assert len(rows) == 2 * 3 * len(TARGETS)  # labkit's 3 kernels and the notebook's 3, on each target
    assert all(result.error is None and result.registers for _, result in rows), [r for _, r in rows if r.error]
    out = capsys.readouterr().out
    if os.environ.get("LABKIT_COMPILE_TABLE"):  # CI prints the table into its log (.ci/run)
        Path(os.environ["LABKIT_COMPILE_TABLE"]).write_text(out)
    assert "registers" in out and "H100 (sm_90)" in out and "A100 (sm_80)" in out and "DOES NOT COMPILE" not in out
