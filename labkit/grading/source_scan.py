"""Read each exercise cell's source, in the grader's own process, for code that reaches around a check.

The cell is parsed (`ast.parse`), never run. What is looked for is what no answer to a lab needs and
what the known ways past a check use: re-loading or re-importing a module (`importlib.reload`,
`spec_from_file_location`, `sys.modules`), reaching objects or frames the learner's code was not
handed (`gc`, `sys._getframe`, `f_back`, `f_globals`), making functions from code objects
(`__code__`, `types.FunctionType`, `marshal`), running text as code (`exec`, `eval`, `compile`),
hooks (`sys.settrace`, `sys.meta_path`, audit hooks), patching the builtins, and importing labkit's
checking code (`labkit.grading`, `labkit.labs.labN`, the checks' diagnosis); and in an exercise cell,
any use of labkit's own answer to that exercise (`Exercise.answers`), which answer blocking stops in the
notebook only as long as the block is left on. Names are followed through the notebook's imports, in
any cell (`import importlib as il; il.reload(...)`, `from sys import modules`), and a string that names
one of them (`getattr(f, "__code__")`) counts too. A finding is for a
person to read: it is flagged for review beside the similarity report, never failed by itself.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

_RELOADS = "makes a second copy of a module's functions, which a check's hold on labkit's cannot reach"
_FRAMES = "reads another function's frame: the checker's own variables (its inputs, its answers)"
_CODE = "builds a function from a code object: a copy of labkit's answer that no check can tell apart"
_TEXT_AS_CODE = "runs code made from text, which a reader of the cell does not see"
_HOOKS = "installs a hook that sees or changes what other code does (calls, imports), the checker's included"
_CHECKING = "imports labkit's checking code: an answer needs none of it"

# Dotted names (a name or any attribute below it) -> why an exercise cell that uses one is worth a look.
SUSPICIOUS_NAMES: dict[str, str] = {
    "importlib.reload": _RELOADS,
    "importlib.util.spec_from_file_location": _RELOADS,
    "importlib.util.module_from_spec": _RELOADS,
    "importlib.machinery": _RELOADS,
    "importlib.import_module": "imports a module named by a string, out of a reader's sight",
    "__import__": "imports a module named by a string, out of a reader's sight",
    "sys.modules": "the table of loaded modules: code can swap labkit's modules or import them afresh",
    "gc": "the garbage collector lists every live object, the originals a check put aside included",
    "sys._getframe": _FRAMES,
    "inspect.currentframe": _FRAMES,
    "inspect.stack": _FRAMES,
    "inspect.getouterframes": _FRAMES,
    "inspect.trace": _FRAMES,
    "types.FunctionType": _CODE,
    "types.CodeType": _CODE,
    "types.LambdaType": _CODE,
    "marshal": "turns compiled bytes (a .pyc) back into code objects",
    "exec": _TEXT_AS_CODE,
    "eval": _TEXT_AS_CODE,
    "compile": _TEXT_AS_CODE,
    "sys.settrace": _HOOKS,
    "sys.setprofile": _HOOKS,
    "threading.settrace": _HOOKS,
    "threading.setprofile": _HOOKS,
    "sys.meta_path": _HOOKS,
    "sys.path_hooks": _HOOKS,
    "sys.path_importer_cache": _HOOKS,
    "sys.addaudithook": _HOOKS,
    "builtins": "the built-in names every module shares: changing them changes the checker's too",
    "__builtins__": "the built-in names every module shares: changing them changes the checker's too",
    "labkit.grading": _CHECKING,
    "labkit.labs.common.diagnose": _CHECKING,
    "labkit.labs.common.mistakes": _CHECKING,
}
NOTEBOOK_API = frozenset({"labkit.grading.check"})  # what the handed-out notebooks use from the checking code
_ANSWER = "uses labkit's own answer to this exercise, the code the exercise asks for"
_LAB_PACKAGE = re.compile(r"labkit\.labs\.lab\d+(\..*)?")  # a lab's own package: its exercise specs and oracles
# Attributes that lead to frames, code objects and module globals, whatever object they are read from.
SUSPICIOUS_ATTRIBUTES: dict[str, str] = {
    **dict.fromkeys(("f_back", "f_globals", "f_locals", "f_code", "f_builtins"), _FRAMES),
    **dict.fromkeys(("tb_frame", "gi_frame", "cr_frame", "ag_frame"), _FRAMES),
    "__code__": _CODE,
    "__globals__": "a function's module namespace: reaches what the function's module holds, past the notebook",
    "__closure__": "the variables a function closed over: reaches what its maker kept out of sight",
    "__builtins__": "the built-in names every module shares: changing them changes the checker's too",
    "__new__": "makes an object without running its class's __init__: past a class whose making is checked",
    "__subclasses__": "lists every subclass alive in the process: a way to objects the cell was not given",
}


MAX_WHAT = 80  # characters of a finding's `what` (a string constant of the cell's may be long)


@dataclass(frozen=True)
class Finding:
    """One place in an exercise cell worth a reviewer's look: where, what, and why."""

    exercise: str
    line: int
    what: str
    why: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _why(dotted: str) -> str | None:
    """Why `dotted` (a module, or a name inside one) is suspicious, or None."""
    if dotted in NOTEBOOK_API:
        return None
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        if (why := SUSPICIOUS_NAMES.get(".".join(parts[:cut]))) is not None:
            return why
    return _CHECKING if _LAB_PACKAGE.fullmatch(dotted) else None


class _Scanner(ast.NodeVisitor):
    """Walks one cell: records imports as aliases of dotted names, and each suspicious use once per line.
    `answers` are the exercise's own (`Exercise.answers`); `aliases` the names the notebook's imports bound."""

    def __init__(self, exercise: str, answers: Collection[str] = (), aliases: Mapping[str, str] | None = None) -> None:
        self.exercise = exercise
        self.answers = answers
        self.aliases: dict[str, str] = dict(aliases or {})  # a name bound by an import -> the dotted name it stands for
        self.findings: dict[tuple[int, str], Finding] = {}

    def _why(self, dotted: str) -> str | None:
        if any(dotted == answer or dotted.startswith(answer + ".") for answer in self.answers):
            return _ANSWER
        return _why(dotted)

    def _flag(self, node: ast.AST, what: str, why: str) -> None:
        line = getattr(node, "lineno", 0)
        what = what if len(what) <= MAX_WHAT else what[: MAX_WHAT - 3] + "..."
        self.findings.setdefault((line, what), Finding(self.exercise, line, what, why))

    def _dotted(self, node: ast.expr) -> str | None:
        """`a.b.c` with `a` read through the cell's imports, or None for anything but names and attributes."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute) and (base := self._dotted(node.value)) is not None:
            return f"{base}.{node.attr}"
        return None

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            top = alias.name.partition(".")[0]  # `import a.b` binds `a`; `import a.b as x` binds x to a.b
            self.aliases[alias.asname or top] = alias.name if alias.asname else top
            if why := self._why(alias.name):
                self._flag(node, f"import {alias.name}", why)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for alias in node.names:
            dotted = f"{module}.{alias.name}" if module else alias.name
            self.aliases[alias.asname or alias.name] = dotted
            if why := self._why(dotted):
                self._flag(node, f"from {module} import {alias.name}", why)

    def visit_Name(self, node: ast.Name) -> None:
        dotted = self.aliases.get(node.id, node.id)
        if why := self._why(dotted):
            self._flag(node, dotted, why)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if why := SUSPICIOUS_ATTRIBUTES.get(node.attr):
            self._flag(node, f".{node.attr}", why)
        dotted = self._dotted(node)
        if dotted is not None and (why := self._why(dotted)):
            self._flag(node, dotted, why)
            return  # one finding for `sys.modules.pop`, not one per part as well
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        """A string that names one (`getattr(f, "__code__")`, `import_module("labkit.grading.attempt")`); not a
        bare word such as "eval", which honest code prints and passes as an option."""
        if not isinstance(node.value, str):
            return
        dotted_or_dunder = "." in node.value or node.value.startswith("__")
        if why := SUSPICIOUS_ATTRIBUTES.get(node.value) or (dotted_or_dunder and _why(node.value)):
            self._flag(node, repr(node.value), why)


def _python(source: str) -> str:
    """The cell as the kernel runs it: IPython's magics (`%time`, `!ls`) turned into the calls they stand for.
    A cell magic's line (`%%capture`) is blanked, so that its body is read as the code it runs."""
    from IPython.core.inputtransformer2 import TransformerManager

    lines = source.split("\n")
    first = next((number for number, line in enumerate(lines) if line.strip()), 0)
    if lines[first].lstrip().startswith("%%"):
        lines[first] = ""
    return TransformerManager().transform_cell("\n".join(lines))


def _parsed(source: str) -> ast.Module | None:
    """The cell's syntax tree, or None for a cell Python cannot parse (the kernel could not run it either)."""
    try:
        return ast.parse(_python(source))
    except (SyntaxError, ValueError):
        return None


def notebook_aliases(sources: Iterable[str]) -> dict[str, str]:
    """The names the notebook's imports bind, in any of its cells (`from labkit.kv.attention import attention as a`
    in a first cell, `a(...)` in an exercise cell)."""
    aliases: dict[str, str] = {}
    for tree in filter(None, map(_parsed, sources)):
        scanner = _Scanner("")
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                scanner.visit(node)
        aliases.update(scanner.aliases)
    return aliases


def scan_cell(
    exercise: str,
    source: str,
    handed_out: Collection[str] = (),
    answers: Collection[str] = (),
    aliases: Mapping[str, str] | None = None,
) -> list[Finding]:
    """What in one cell reaches around a check, or uses the exercise's own `answers`, in line order, but on
    lines that the handed-out notebook has too (`handed_out`: stripped lines). A cell that does not parse
    finds nothing: the kernel could not run it either, so it defined nothing (the run's notes say so)."""
    tree = _parsed(source)
    if tree is None:
        return []
    scanner = _Scanner(exercise, answers, aliases)
    scanner.visit(tree)
    lines = source.split("\n")
    added = [
        f
        for f in scanner.findings.values()
        if not 0 < f.line <= len(lines) or lines[f.line - 1].strip() not in handed_out
    ]
    return sorted(added, key=lambda finding: (finding.line, finding.what))


def scan_notebook(
    cells: Mapping[str, str], answers: Mapping[str, Collection[str]], handed_out: Collection[str] | None
) -> list[Finding]:
    """A submission's findings: its exercise cells (`answers`: the lab's exercise ids -> their declared answers)
    whole, and its other code cells (keyed `cell N`, or tagged as an exercise the lab does not have) on the
    lines the learner added to the handed-out notebook; those are skipped where it is unknown (None), since
    the notebook's own imports of labkit's checks could not be told from added ones."""
    aliases = notebook_aliases(cells.values())
    found = [
        f for key, source in cells.items() if key in answers for f in scan_cell(key, source, (), answers[key], aliases)
    ]
    if handed_out is not None:
        others = [(key, source) for key, source in cells.items() if key not in answers]
        found += [f for key, source in others for f in scan_cell(key, source, handed_out, (), aliases)]
    return found
