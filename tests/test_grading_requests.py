"""Issue 55.1: what the grader sends a learner's kernel holds inputs and a run, never what decides the grade.

Every exercise of every lab (and the demo) is turned into the request the grader writes, with a pickler that
writes down everything it reaches: no `Exercise`, no `make_inputs`, `oracle` or `compare` of any exercise and
no mistake simulator and no lookup in the registry of checks (empty there) may be among them, the request stays small (the models travel by name), and it loads in a
process where no grader-only module can be imported. Then the modules themselves: every check's halves are
defined in a grader-only module, and no visible module imports one.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import labkit
from labkit.grading import grader_only, request
from labkit.grading.answers import reference
from labkit.grading.checks import Exercise, exercises_for_lab, get_exercise
from labkit.labs.manifest import LABS

LAB_NAMES = ["demo", *(lab.name for lab in LABS)]
MAX_REQUEST_BYTES = 8 << 20
PACKAGE = Path(labkit.__file__).resolve().parent

# The typical-mistake simulators: each computes what a wrong answer gives, so it names the mistake to the grader.
SIMULATORS = (
    "labkit.labs.common.diagnose.known_attention_mistakes",
    "labkit.labs.lab8.sampling.first_token_distribution",
    "labkit.labs.lab8.sampling.closest_rule",
    "labkit.labs.lab9.admission.wrong_answer",
    "labkit.labs.lab9.dashboard.typical_misreadings",
    "labkit.labs.lab11.variants.simulate",
    "labkit.labs.lab12.handoff.simulate",
)


def _exercises_inside(value: Any, found: dict[int, Exercise]) -> None:
    """Every Exercise a check's functions close over (on_its_own's pieces), added to `found`."""
    if isinstance(value, Exercise):
        if id(value) not in found:
            found[id(value)] = value
            for part in (value.make_inputs, value.oracle, value.compare, value.run):
                _exercises_inside(part, found)
    elif isinstance(value, functools.partial):
        _exercises_inside(value.func, found)
    elif inspect.isfunction(value):
        for cell in value.__closure__ or ():
            with_contents = cell.cell_contents if cell.cell_contents is not None else ()
            _exercises_inside(with_contents, found)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _exercises_inside(item, found)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            _exercises_inside(getattr(value, field.name), found)


@functools.cache
def forbidden() -> dict[int, str]:
    """id -> name of everything a request must not reach: the checks' grader halves and the simulators."""
    exercises: dict[int, Exercise] = {}
    for lab in LAB_NAMES:
        for exercise in exercises_for_lab(lab):
            _exercises_inside(exercise, exercises)
    named = {}
    for exercise in exercises.values():
        for part in ("make_inputs", "oracle", "compare"):
            named[id(getattr(exercise, part))] = f"{exercise.id}'s {part}"
    for dotted in SIMULATORS:
        named[id(reference(dotted))] = dotted
    for lookup in (get_exercise, exercises_for_lab):  # the registry is empty in the kernel: a run must not ask it
        named[id(lookup)] = f"the registry's {lookup.__name__}"
    return named


class Recording(request._Pickler):
    """The grader's pickler, writing down every object it is asked to pickle."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reached: list[Any] = []

    def reducer_override(self, obj: Any) -> Any:
        self.reached.append(obj)
        return super().reducer_override(obj)


def watched_request(exercise: Exercise, seed: int = 3) -> tuple[bytes, list[Any]]:
    reached: list[Any] = []

    class Watching(Recording):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.reached = reached

    return request.request_bytes(request.build_request(exercise, seed), pickler=Watching), reached


# Loads every request it is handed, each in turn, where no grader-only module can be imported; prints, as JSON,
# each file's outcome: "ok", or the error that loading it raised.
BLOCKED_LOADER = (
    "import json, sys\n"
    f"HIDDEN = {grader_only.GRADER_ONLY!r}\n"
    "class Blocker:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name in HIDDEN:\n"
    "            raise ImportError(f'{name} is the grader\\'s')\n"
    "sys.meta_path.insert(0, Blocker())\n"
    "from labkit.grading.request import load_request\n"
    "outcomes = {}\n"
    "for path in sys.argv[1:]:\n"
    "    try:\n"
    "        loaded = load_request(open(path, 'rb').read())\n"
    "        outcomes[path] = 'ok' if callable(loaded.run) else 'its run is not callable'\n"
    "    except Exception as error:\n"
    "        outcomes[path] = f'{type(error).__name__}: {error}'\n"
    "print(json.dumps(outcomes))\n"
)


@dataclasses.dataclass(frozen=True)
class Written:
    """One exercise's request as the grader writes it: what it reached that it must not, its size, how it loaded."""

    reached: list[str]
    size: int
    loaded: str


@pytest.fixture(scope="module")
def every_request(tmp_path_factory) -> dict[str, Written]:
    """Every exercise's request of every lab, written and watched here, then loaded in one blocked process (one
    start of Python and torch for them all, not one per lab): exercise id -> what became of it."""
    folder = tmp_path_factory.mktemp("requests")
    watched = {}
    for lab in LAB_NAMES:
        for exercise in exercises_for_lab(lab):
            data, reached = watched_request(exercise)
            bad = forbidden()
            found = sorted({bad[id(obj)] for obj in reached if id(obj) in bad})
            found += sorted({f"an Exercise ({obj.id})" for obj in reached if isinstance(obj, Exercise)})
            path = folder / f"{exercise.id}.pkl"
            path.write_bytes(data)
            watched[exercise.id] = (found, len(data), str(path))
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    paths = [path for _, _, path in watched.values()]
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_LOADER, *paths], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.splitlines()[-1])
    return {key: Written(found, size, loaded[path]) for key, (found, size, path) in watched.items()}


@pytest.mark.parametrize("lab", LAB_NAMES)
def test_a_request_reaches_no_oracle_and_loads_where_the_grader_only_modules_cannot(lab, every_request):
    for exercise in exercises_for_lab(lab):
        written = every_request[exercise.id]
        assert written.reached == [], f"{exercise.id}'s request reaches {written.reached}"
        assert written.size < MAX_REQUEST_BYTES, f"{exercise.id}'s request is {written.size} bytes"
        assert written.loaded == "ok", (
            f"{exercise.id}'s request did not load without the grader's modules: {written.loaded}"
        )


def _module_of(function: Any) -> str:
    while isinstance(function, functools.partial):
        function = function.func
    return getattr(function, "__module__", "") or ""


@pytest.mark.parametrize("lab", LAB_NAMES)
def test_every_checks_grader_halves_are_defined_in_a_grader_only_module(lab):
    exercises: dict[int, Exercise] = {}
    _exercises_inside(exercises_for_lab(lab), exercises)
    outside = [
        f"{exercise.id}'s {part} ({_module_of(getattr(exercise, part))})"
        for exercise in exercises.values()
        for part in ("make_inputs", "oracle", "compare")
        if not grader_only.is_grader_only(_module_of(getattr(exercise, part)))
    ]
    assert outside == []


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path) -> set[str]:
    """The labkit modules a file imports (a `from package import module` counts as that module)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in names if name.startswith("labkit.")}


def test_every_module_of_the_labs_is_on_one_side_and_no_visible_one_imports_the_graders():
    files = sorted([*(PACKAGE / "labs").rglob("*.py"), *(PACKAGE / "grading" / "exercises").rglob("*.py")])
    names = {_module_name(path): path for path in files}
    both = set(grader_only.GRADER_ONLY) & set(grader_only.VISIBLE_LABS)
    assert both == set()
    unsorted = sorted(set(names) - set(grader_only.GRADER_ONLY) - set(grader_only.VISIBLE_LABS))
    assert unsorted == [], "put each in grader_only.GRADER_ONLY or VISIBLE_LABS"
    assert sorted(set(grader_only.GRADER_ONLY + grader_only.VISIBLE_LABS) - set(names)) == []  # no stale name
    visible = [path for path in PACKAGE.rglob("*.py") if not grader_only.is_grader_only(_module_name(path))]
    reaching = sorted(
        f"{_module_name(path)} imports {name}"
        for path in visible
        for name in _imported(path)
        if grader_only.is_grader_only(name)
    )
    assert reaching == []
