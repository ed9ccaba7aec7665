"""Compile labkit's kernels and the solved lab 11 notebook's for an A100 and an H100, on any machine, and print
each one's registers, spills and shared memory.

Triton's own compiler (with the ptxas its wheel ships) lowers each ``@triton.jit`` kernel to a cubin for sm_80
and sm_90 without a GPU (labkit.kernels.compile_for_gpu): this proves the kernels are ones a GPU compiles, not
only ones Triton's interpreter runs, and shows what each thread will hold. How fast they run only a GPU can say
(scripts/gpu_check.sh).

    python scripts/compile_kernels.py            # the table; exit 1 if a kernel does not compile
    python scripts/compile_kernels.py --json rows.json
    python scripts/compile_kernels.py --quick    # labkit's smallest kernel for the H100 (the GPU check's dry run)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import nbformat

from labkit.grading.submissions import exercise_cell_sources
from labkit.kernels.compile_for_gpu import TARGETS, Compiled, Job, compile_in_child, compiler_problem
from labkit.kernels.contract import GPU_SIGNATURES
from labkit.labs.lab11.kernel_cell import PRELUDE

NOTEBOOK = Path(__file__).resolve().parents[1] / "labs" / "source" / "lab11_the_kernel.ipynb"
QUICK_KERNEL = "merge_splits_kernel"  # a second to compile, where the others take several
NOTEBOOK_KERNELS = {
    "lab11.paged_decode": ("paged_decode_kernel",),
    "lab11.split_kv": ("split_kv_kernel", "merge_splits_kernel"),
}


def jobs(quick: bool = False) -> list[tuple[str, Job]]:
    """(whose, job) for every kernel, labkit's and the solved notebook's, on every target; ``quick``: labkit's
    smallest (the split-KV merge) on the last target only, enough to show the compiler runs here."""
    sources = exercise_cell_sources(nbformat.read(NOTEBOOK, as_version=4))
    found = []
    for capability in list(TARGETS.values())[-1:] if quick else TARGETS.values():
        for kernel, (signature, constants) in GPU_SIGNATURES.items():
            if quick and kernel != QUICK_KERNEL:
                continue
            found.append(
                ("labkit", Job(kernel, signature, constants, capability, module="labkit.kernels.paged_decode"))
            )
        for exercise, kernels in () if quick else NOTEBOOK_KERNELS.items():
            for kernel in kernels:
                job = Job(kernel, *GPU_SIGNATURES[kernel], capability, source=PRELUDE + sources[exercise])
                found.append(("lab 11 solved", job))
    return found


def table(rows: list[tuple[str, Compiled]]) -> str:
    lines = [f"{'kernel':<36} {'target':<13} {'registers':>9} {'spills (B)':>10} {'shared (B)':>10} {'seconds':>7}"]
    for whose, result in rows:
        name = f"{result.kernel} ({whose})"
        if result.error:
            lines.append(f"{name:<36} {result.target:<13} DOES NOT COMPILE: {result.error.splitlines()[-1]}")
            continue
        lines.append(
            f"{name:<36} {result.target:<13} {result.registers!s:>9} {result.spill_bytes!s:>10} "
            f"{result.shared_bytes!s:>10} {result.seconds:>7.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[tuple[str, Compiled]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--quick", action="store_true", help="labkit's smallest kernel for the last target only")
    args = parser.parse_args(argv)
    problem = compiler_problem()
    if problem:
        sys.exit(f"{problem}: nothing compiled (pip install triton, whose wheel ships ptxas)")
    found = jobs(args.quick)
    rows = list(zip([whose for whose, _ in found], compile_in_child([job for _, job in found])))
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([{"whose": whose, **asdict(result), "ttir": None} for whose, result in rows]))
    if any(result.error for _, result in rows):
        sys.exit(1)
    return rows


if __name__ == "__main__":
    main()
