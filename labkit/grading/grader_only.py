"""Which of labkit's modules only the grader holds: what decides a grade never enters a learner's kernel.

A grader-only module defines an exercise's `make_inputs`, `oracle` or `compare`, a mistake simulator, a
`course_*` answer or a `register(...)` call. In the grading sandbox each is replaced by a stub (its file
and its compiled `.pyc` alike, `sandbox.py`), so the learner's code can neither import it nor read it. What
a kernel-side `run` needs from one travels with the exercise's request by value (`request.py`); what it
needs from a visible module travels by reference. The visible modules of `labkit.labs` are listed; every
other module of the labs is the grader's, so a new one is hidden until it is listed as visible
(`tests/test_grading_requests.py`); the rest of labkit (the engine, the models, `labkit.grading`'s machinery)
is visible.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

# What notebooks and kernel-side runs import from labkit.labs: labkit.labs.api's surface and what it needs.
VISIBLE_LABS = (
    "labkit.labs",
    "labkit.labs.api",
    "labkit.labs.hints",
    "labkit.labs.manifest",
    "labkit.labs.aids",
    "labkit.labs.aids.capacity_widget",
    "labkit.labs.aids.measure",
    "labkit.labs.aids.padded_cache",
    "labkit.labs.common",
    "labkit.labs.common.engine_runs",
    "labkit.labs.common.gate",
    "labkit.labs.common.learner_errors",
    "labkit.labs.common.recording",
    "labkit.labs.common.shared",
    "labkit.labs.lab7.runs",
    "labkit.labs.lab9.load",
    "labkit.labs.lab9.scrape",
    "labkit.labs.lab10.runs",
    "labkit.labs.lab12.replay",
    "labkit.labs.lab12.runs",
    "labkit.labs.lab13.kernels",
    "labkit.labs.lab13.runs",
    "labkit.labs.lab14.moe_model",
    "labkit.labs.lab14.ranks",
    "labkit.labs.lab14.runs",
)


def _modules_under(*packages: str) -> list[str]:
    """Every module of ``packages`` (by their files, nothing imported), a package by its own name."""
    root = Path(__file__).resolve().parents[2]
    names = []
    for package in packages:
        for path in sorted(root.joinpath(*package.split(".")).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


# Every other module of the labs and of the grader's exercises: a new one is hidden until it is listed above.
GRADER_ONLY = tuple(
    name for name in _modules_under("labkit.labs", "labkit.grading.exercises") if name not in VISIBLE_LABS
)

# The text each grader-only file reads as inside the sandbox: a package's stays a package, so that its
# visible modules (labkit.labs.lab7.runs) still import.
STUB = (
    '"""The grader\'s: hidden in the grading sandbox (labkit/grading/grader_only.py)."""\n\n__labkit_hidden__ = True\n'
)


def is_grader_only(module_name: str) -> bool:
    """Whether `module_name` is one of the grader's own modules."""
    return module_name in GRADER_ONLY


def hidden_here(module_name: str) -> bool:
    """Whether `module_name`, as this process imports it, is the sandbox's stub (so nothing of it is reachable)."""
    module = sys.modules.get(module_name)
    if module is None:
        try:
            spec = importlib.util.find_spec(module_name)
        except ModuleNotFoundError:
            return False
        return spec is not None and spec.origin is not None and Path(spec.origin).read_text() == STUB
    return getattr(module, "__labkit_hidden__", False) is True


def source_files() -> list[Path]:
    """The `.py` file of every grader-only module, where this labkit is installed."""
    root = Path(__file__).resolve().parents[2]
    files = []
    for name in GRADER_ONLY:
        path = root.joinpath(*name.split("."))
        files.append(path / "__init__.py" if path.is_dir() else path.with_suffix(".py"))
    return [path for path in files if path.is_file()]


def pycache_folders() -> list[Path]:
    """The `__pycache__` folders beside grader-only files: their `.pyc` hold the same code, compiled."""
    return sorted({path.parent / "__pycache__" for path in source_files()})


def send_by_value() -> None:
    """Have cloudpickle copy what a request reaches in the grader-only modules imported here, rather than
    name it (the kernel could not import it)."""
    import cloudpickle

    for name in GRADER_ONLY:
        if name in sys.modules:
            cloudpickle.register_pickle_by_value(sys.modules[name])
