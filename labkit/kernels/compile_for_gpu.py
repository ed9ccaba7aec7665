"""Compile Triton kernels for a GPU with Triton's own compiler, on any machine: proof that they compile, and their cost.

Triton's interpreter runs Python that no GPU would: a ``break`` out of a loop, a Python float carried through
one, a Python ``if`` on a tensor. Its compiler rejects them, and it runs without a GPU: Triton's wheel ships
``ptxas``, so a kernel lowers to PTX and to a cubin for an A100 (sm_80) or an H100 (sm_90) on a laptop, in
seconds. ptxas then reports what a GPU would give each thread: registers, bytes spilled to local memory, and
Triton adds the shared memory it allocates.

A kernel compiles only where ``@triton.jit`` made it compilable (not in an interpreter process), so compiling
happens in a child process (:func:`compile_in_child`, ``python -m labkit.kernels.compile_for_gpu``) that loads
the kernels' module, or a notebook cell's source, with the interpreter off. Results are kept by the hash of
what was compiled, so asking again costs nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import linecache
import os
import re
import subprocess
import sys
import time
import types
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TARGETS = {"A100 (sm_80)": 80, "H100 (sm_90)": 90}  # the GPU targets labkit compiles for: name -> capability
COMPILE_TIMEOUT_S = 180.0  # for one child's whole batch of kernels


@dataclass(frozen=True)
class Job:
    """One kernel to compile: from a module (``module``) or from source text (``source``), for one capability."""

    kernel: str
    signature: dict[str, str]  # parameter -> Triton type ("*bf16", "i32", "fp32", or "constexpr")
    constexprs: dict[str, Any]
    capability: int
    module: str | None = None
    source: str | None = None

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Compiled:
    """What compiling one kernel for one target gave: its resources, or the compiler's error."""

    kernel: str
    capability: int
    seconds: float
    registers: int | None = None  # per thread
    spill_bytes: int | None = None  # spill stores to local memory, per thread
    shared_bytes: int | None = None  # shared memory a program uses
    error: str | None = None
    ttir: str = ""  # Triton's IR, for checks that read what the kernel computes in which type

    @property
    def target(self) -> str:
        return next((name for name, cap in TARGETS.items() if cap == self.capability), f"sm_{self.capability}")


class CompilerUnavailableError(RuntimeError):
    """Triton's compiler cannot run here (no ptxas, or no Triton): nothing about the kernel."""


def compiler_problem() -> str | None:
    """Why Triton cannot compile for an NVIDIA target on this machine, or None when it can."""
    try:
        from labkit.kernels.runtime import triton  # set up first: Triton imported bare would not interpret here

        ptxas = triton.knobs.nvidia.ptxas.path
    except Exception as error:  # no Triton, or no ptxas in its wheel nor on TRITON_PTXAS_PATH
        return f"Triton's compiler cannot run here ({type(error).__name__}: {error})"
    if not (ptxas and os.access(ptxas, os.X_OK)):
        return f"Triton's compiler cannot run here: ptxas is missing ({ptxas!r})"
    return None


# --- in the child: the kernels compilable, compiled one by one ----------------------------------------------

_PTXAS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "spill_bytes": re.compile(r"(\d+) bytes spill stores"),
}


def _load(job: Job, loaded: dict[str, types.ModuleType]) -> types.ModuleType:
    """The job's module, imported, or its source run as a module of its own (a notebook cell's kernels)."""
    if job.module is not None:
        return importlib.import_module(job.module)
    source = job.source or ""
    name = "_cell_" + hashlib.sha256(source.encode()).hexdigest()[:16]
    if name not in loaded:
        filename = f"<kernel cell {name}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # Triton reads the source
        module = types.ModuleType(name)
        module.__file__ = filename
        sys.modules[name] = module
        exec(compile(source, filename, "exec"), module.__dict__)
        loaded[name] = module
    return loaded[name]


def compile_kernel(kernel: Any, job: Job) -> Compiled:
    """Compile one ``@triton.jit`` function (made with the interpreter off) for ``job``'s target."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    started = time.perf_counter()
    log = io.StringIO()
    try:
        with knobs.nvidia.scope(), knobs.compilation.scope(), contextlib.redirect_stdout(log):
            knobs.nvidia.dump_ptxas_log = True  # ptxas -v: registers and spills, printed
            knobs.compilation.always_compile = True  # past Triton's cache, which keeps no ptxas log
            compiled = triton.compile(
                ASTSource(fn=kernel, signature=job.signature, constexprs=job.constexprs),
                target=GPUTarget("cuda", job.capability, 32),
            )
    except Exception as error:
        return Compiled(job.kernel, job.capability, time.perf_counter() - started, error=_error_text(error))
    found = {key: pattern.search(log.getvalue()) for key, pattern in _PTXAS.items()}
    return Compiled(
        job.kernel,
        job.capability,
        time.perf_counter() - started,
        registers=int(found["registers"].group(1)) if found["registers"] else None,
        spill_bytes=int(found["spill_bytes"].group(1)) if found["spill_bytes"] else None,
        shared_bytes=compiled.metadata.shared,
        ttir=compiled.asm.get("ttir", ""),
    )


def _error_text(error: BaseException) -> str:
    """Triton's own message: the kernel's lines at the fault, a caret, and what the compiler refused."""
    text = str(error).strip() or type(error).__name__
    return text if type(error).__module__.startswith("triton") else f"{type(error).__name__}: {text}"


def run_jobs(jobs: list[Job]) -> list[Compiled]:
    """Compile every job in this process (which must have the interpreter off)."""
    loaded: dict[str, types.ModuleType] = {}
    results = []
    for job in jobs:
        try:
            kernel = getattr(_load(job, loaded), job.kernel)
        except Exception as error:
            results.append(Compiled(job.kernel, job.capability, 0.0, error=_error_text(error)))
            continue
        results.append(compile_kernel(kernel, job))
    return results


def main() -> None:
    """The child: jobs as JSON on stdin, results as JSON on stdout."""
    jobs = [Job(**job) for job in json.load(sys.stdin)]
    with contextlib.redirect_stdout(sys.stderr):  # whatever a module prints stays out of the answer
        results = run_jobs(jobs)
    json.dump([asdict(result) for result in results], sys.stdout)


# --- in the caller: a child per batch, results kept ---------------------------------------------------------

_results: dict[str, Compiled] = {}


def compile_in_child(jobs: list[Job], timeout: float = COMPILE_TIMEOUT_S) -> list[Compiled]:
    """Compile ``jobs`` in a child process with the interpreter off (those compiled before come from memory).

    Raises :class:`CompilerUnavailableError` when Triton's compiler cannot run here, and ``TimeoutError``
    when the child takes longer than ``timeout`` seconds.
    """
    problem = compiler_problem()
    if problem:
        raise CompilerUnavailableError(problem)
    todo = [job for job in jobs if job.key() not in _results]
    if todo:
        env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
        env["LABKIT_TRITON_COMPILE_ONLY"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")])
        )
        try:
            child = subprocess.run(
                [sys.executable, "-m", __name__],
                input=json.dumps([asdict(job) for job in todo]),
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"compiling took longer than {timeout:g} s") from None
        if child.returncode != 0:
            last = (child.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"the compiling process failed (exit {child.returncode}): {last}")
        for job, result in zip(todo, json.loads(child.stdout)):
            _results[job.key()] = Compiled(**result)
    return [_results[job.key()] for job in jobs]


if __name__ == "__main__":
    main()
