"""The layers hold: plain-Python parts load no torch, the model code loads no engine, no package cycles.

Each import runs in a fresh interpreter, so what it loads is what it needs, not what an
earlier test happened to import. The simulator, the planner, the metrics and the
scheduler are napkin maths and bookkeeping: they must answer instantly on a machine
where loading torch takes seconds.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import labkit

PACKAGE = Path(labkit.__file__).parent
PLAIN_PYTHON = [
    "labkit.engine.scheduler",
    "labkit.engine.core",
    "labkit.kv.block_allocator",
    "labkit.sim",
    "labkit.sim.cost_model",
    "labkit.sim.simulator",
    "labkit.sim.calibrate",
    "labkit.capacity",
    "labkit.capacity.parallel",
    "labkit.metrics",
    "labkit.workloads",
    "labkit.trace",
    "labkit.sampling_params",
    "labkit.kernels.traffic",
    "labkit.kernels.bench_math",
]


def modules_loaded_by(code: str) -> set[str]:
    """The names in sys.modules after running ``code`` in a fresh interpreter."""
    script = f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def of(package: str, loaded: set[str]) -> set[str]:
    return {name for name in loaded if name == package or name.startswith(package + ".")}


def heavy_modules_loaded_by(code: str) -> set[str]:
    """What of torch and labkit.models running ``code`` in a fresh interpreter loads."""
    loaded = modules_loaded_by(code)
    return of("torch", loaded) | of("labkit.models", loaded)


def test_plain_python_layers_load_no_torch_and_no_model_code():
    """One interpreter imports them all: what is loaded only grows, so if together they load neither torch nor
    model code, none of them does alone. Only if they do, a fresh interpreter for each names the culprits."""
    if heavy_modules_loaded_by("\n".join(f"import {module}" for module in PLAIN_PYTHON)):
        culprits = {module: sorted(heavy_modules_loaded_by(f"import {module}"))[:5] for module in PLAIN_PYTHON}
        named = {module: found for module, found in culprits.items() if found}
        pytest.fail(f"plain-python layers load torch or labkit.models: {named}")


def test_the_model_code_loads_nothing_of_engine_sim_or_grading():
    loaded = modules_loaded_by("import labkit.models, labkit.models.llama, labkit.models.loading")
    for layer in ("labkit.engine", "labkit.sim", "labkit.grading", "labkit.labs"):
        assert not of(layer, loaded), f"labkit.models loads {sorted(of(layer, loaded))}"


@pytest.mark.parametrize("argv", [["plan", "--example", "sale"], ["plan", "--help"], ["--help"]])
def test_labkit_plan_and_help_answer_without_torch(argv):
    loaded = modules_loaded_by(
        "import contextlib, io\nfrom labkit.cli import main\n"
        f"with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        f"    main({argv!r})"
    )
    assert "labkit.cli" in loaded and not of("torch", loaded)


def package_of(module: str) -> str:
    """The top-level part of labkit a module belongs to: ``labkit.kv.paged_cache`` -> ``labkit.kv``."""
    return ".".join(module.split(".")[:2])


def import_graph() -> dict[str, set[str]]:
    """Package -> the other labkit packages its modules import, anywhere in the file."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        source = package_of(".".join(parts))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                if name.startswith("labkit.") and package_of(name) != source:
                    graph.setdefault(source, set()).add(package_of(name))
    return graph


def test_no_import_cycle_between_packages():
    graph = import_graph()

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for target in graph.get(todo.pop(), ()):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    cycles = sorted((a, b) for a, targets in graph.items() for b in targets if a in reachable(b))
    assert not cycles, f"packages that import each other (directly or through others): {cycles}"
    assert "labkit.kv" in graph["labkit.models"]  # the graph is real: llama.py uses the contiguous cache


@pytest.mark.parametrize(
    ("layer", "must_not_import"),
    [
        ("labkit.sim", {"labkit.serve"}),  # the simulator predicts a server; it does not run one
        ("labkit.engine", {"labkit.labs", "labkit.grading", "labkit.serve", "labkit.sim"}),
        ("labkit.kv", {"labkit.labs", "labkit.grading"}),
        ("labkit.speculative", {"labkit.labs", "labkit.grading"}),
        ("labkit.kernels", {"labkit.engine", "labkit.labs", "labkit.grading", "labkit.serve", "labkit.sim"}),
        ("labkit.workloads", {"labkit.serve", "labkit.sim", "labkit.engine"}),
    ],
)
def test_lower_layers_import_nothing_from_the_layers_built_on_them(layer, must_not_import):
    imported = import_graph().get(layer, set())
    assert not imported & must_not_import, f"{layer} imports {sorted(imported & must_not_import)}"


def private_reads(source: str, defined: set[str]) -> list[str]:
    """``x._name`` reads in ``source`` of a private name that ``defined`` (the names the labs define) lacks.

    ``self._x`` and ``cls._x`` are the module's own; a module imported from outside labkit (``sys._getframe``)
    is the interpreter's, not another package's internals.
    """
    tree = ast.parse(source)
    outside = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if not alias.name.startswith("labkit")
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if owner not in {"self", "cls", *outside} and node.attr not in defined:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("labkit."):
            if not node.module.startswith("labkit.labs"):
                found += [f"line {node.lineno}: {a.name} from {node.module}" for a in node.names if a.name[0] == "_"]
    return found


def names_defined_in(folder: Path) -> set[str]:
    """Every function, class, attribute and variable name that the modules under ``folder`` define."""
    names = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute | ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.attr if isinstance(node, ast.Attribute) else node.id)
    return names


def test_no_lab_module_reads_a_private_attribute_of_another_package():
    """A lab's check uses what the engine offers in public (``pool_state()``), so the engine can change inside."""
    labs = PACKAGE / "labs"
    defined = names_defined_in(labs)
    found = {
        str(path.relative_to(PACKAGE)): reads
        for path in sorted(labs.rglob("*.py"))
        if (reads := private_reads(path.read_text(), defined))
    }
    assert not found, f"private reads of other packages (add a public read-out there): {found}"


def test_the_private_read_check_sees_one():
    """The check above flags what lab 7's check once did, and passes what is allowed."""
    assert private_reads("def f(blocks):\n    return blocks._refs\n", set()) == ["line 2: blocks._refs"]
    assert private_reads("from labkit.kv.prefix_cache import _x\n", set()) == ["line 1: _x from labkit.kv.prefix_cache"]
    allowed = "import sys\nclass A:\n    def f(self):\n        return self._y, sys._getframe(0), b._mine\n"
    assert private_reads(allowed, {"_mine"}) == []
