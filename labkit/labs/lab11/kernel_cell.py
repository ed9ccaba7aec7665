"""What a kernel exercise's cell may hold, read as data (never run): Triton kernels, and nothing else that runs.

Lab 11 grades kernels, not outputs. A cell that passes this rule defines its kernels as ``@triton.jit``
functions whose bodies speak Triton's language only, and has no other code that runs when the cell does:
imports of triton, triton.language, torch and math, constants, and the kernels. So nothing in it can stand
in for a kernel (an object that answers ``kernel[grid](...)`` with PyTorch), do a kernel's work on the side
(a pre-run hook, a patched launcher), or reach Python from inside one; and its source can be compiled in a
child process without side effects (:mod:`labkit.kernels.compile_for_gpu`).
"""

from __future__ import annotations

import ast

ALLOWED_IMPORTS = frozenset({"triton", "triton.language", "torch", "math"})
BUILTINS = frozenset({"range", "float", "int", "min", "max", "len", "abs", "bool"})  # what Triton's compiler takes
_FUNCTION_NODES = (
    # statements
    ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.For, ast.While, ast.If, ast.Return, ast.Pass,
    ast.Break, ast.Continue,  # the compiler refuses these, by name: the rule leaves them to it
    # expressions
    ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Call, ast.keyword, ast.Attribute, ast.Subscript,
    ast.Slice, ast.Name, ast.Constant, ast.Tuple, ast.List, ast.IfExp,
    ast.operator, ast.unaryop, ast.boolop, ast.cmpop, ast.expr_context,
)  # fmt: skip


PRELUDE = "import triton\nimport triton.language as tl\n"  # what the lab's first cell binds for every later one


class _Cell:
    """The names the cell binds at the top: Triton's modules, other modules, constants, kernels."""

    def __init__(self, tree: ast.Module) -> None:
        self.triton: set[str] = {"triton"}  # names bound to triton (the lab's first cell binds triton and tl)
        self.language: set[str] = {"tl"}  # names bound to triton.language
        self.modules: set[str] = set()  # torch, math and their aliases
        self.kernels = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        self.constants: set[str] = set()
        self._kinds = {"triton": "triton", "tl": "triton.language"}

    def bind(self, name: str, kind: str) -> str | None:
        """Record that the cell binds ``name`` to a ``kind`` of thing; why not, if it was bound to another:
        what reads as Triton's language must be it, and a constant or kernel is bound once."""
        if self._kinds.get(name, kind) != kind or (name in self._kinds and kind in ("constant", "kernel")):
            return f"{name} is bound twice (to {self._kinds[name]}, then to a {kind}): bind each name once"
        self._kinds[name] = kind
        return None


def kernel_cell_problem(source: str, kernels: tuple[str, ...]) -> str | None:
    """Why ``source`` is not a cell of Triton kernels defining ``kernels`` (None when it is)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        return f"the exercise cell is not valid Python: {error.msg} (line {error.lineno})"
    cell = _Cell(tree)
    for node in tree.body:
        problem = _top_level_problem(node, cell)
        if problem:
            return f"line {node.lineno}: {problem}"
    missing = [name for name in kernels if name not in cell.kernels]
    if missing:
        return f"the exercise cell defines no @triton.jit function named {', '.join(missing)}"
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            problem = _kernel_problem(node, cell)
            if problem:
                return f"in {node.name}: {problem}"
    return None


def _top_level_problem(node: ast.stmt, cell: _Cell) -> str | None:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name not in ALLOWED_IMPORTS:
                return f"import {alias.name}: a kernel cell imports only {', '.join(sorted(ALLOWED_IMPORTS))}"
            bound = alias.asname or alias.name.partition(".")[0]
            kind = alias.name if alias.asname else bound
            if problem := cell.bind(bound, kind):
                return problem
            if alias.name == "triton.language" and alias.asname:
                cell.language.add(bound)
            elif alias.name.startswith("triton"):
                cell.triton.add(bound)
            else:
                cell.modules.add(bound)
        return None
    if isinstance(node, ast.ImportFrom):
        if node.module == "triton" and all(alias.name == "language" for alias in node.names):
            for alias in node.names:
                if problem := cell.bind(alias.asname or alias.name, "triton.language"):
                    return problem
                cell.language.add(alias.asname or alias.name)
            return None
        return (
            f"from {node.module} import ...: a kernel cell imports only {', '.join(sorted(ALLOWED_IMPORTS))}, as "
            "modules (import triton.language as tl)"
        )
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return None  # a string, a note
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if all(isinstance(target, ast.Name) for target in targets) and node.value and _constant(node.value, cell):
            names = [target.id for target in targets if isinstance(target, ast.Name)]
            problem = next(filter(None, (cell.bind(name, "constant") for name in names)), None)
            cell.constants.update(names)
            return problem
        return "only constants may be assigned outside the kernels (NAME = a number, or tl.constexpr(a number))"
    if isinstance(node, ast.FunctionDef):
        if len(node.decorator_list) != 1 or not _is_jit(node.decorator_list[0], cell):
            return (
                f"{node.name} is not decorated with plain @triton.jit: the check launches your kernels itself, "
                "so the cell defines kernels only (no Python wrappers, no decorator arguments)"
            )
        return cell.bind(node.name, "kernel")
    return (
        f"{ast.unparse(node).splitlines()[0][:60]!r} runs when the cell does: the cell may hold imports, constants and "
        "@triton.jit functions only (no classes, hooks, patches or other code that runs when the cell does)"
    )


def _is_jit(decorator: ast.expr, cell: _Cell) -> bool:
    return (
        isinstance(decorator, ast.Attribute)
        and decorator.attr == "jit"
        and isinstance(decorator.value, ast.Name)
        and decorator.value.id in cell.triton
    )


def _constant(node: ast.expr, cell: _Cell) -> bool:
    """A number, a string, arithmetic on them, or tl.constexpr(...) of one."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp):
        return _constant(node.operand, cell)
    if isinstance(node, ast.BinOp):
        return _constant(node.left, cell) and _constant(node.right, cell)
    if isinstance(node, ast.Call) and _language_call(node.func, cell) == "constexpr":
        return len(node.args) == 1 and not node.keywords and _constant(node.args[0], cell)
    return False


def _language_call(func: ast.expr, cell: _Cell) -> str | None:
    """The name after ``tl.`` (or ``triton.language.``) in ``func``, or None if it is not Triton's language."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name) or not parts:
        return None
    parts.reverse()
    if func.id in cell.language:
        return ".".join(parts)
    if func.id in cell.triton and parts[0] == "language" and len(parts) > 1:
        return ".".join(parts[1:])
    return None


def _kernel_problem(function: ast.FunctionDef, cell: _Cell) -> str | None:
    arguments = function.args
    if arguments.vararg or arguments.kwarg or arguments.kwonlyargs or arguments.posonlyargs:
        return "a kernel takes plain named parameters only (no *args, **kwargs or keyword-only ones)"
    for default in arguments.defaults:
        if not _constant(default, cell):
            return "a parameter's default must be a constant"
    for argument in arguments.args:
        if argument.annotation is not None and _language_call(argument.annotation, cell) != "constexpr":
            return f"parameter {argument.arg}: the only annotation a kernel's parameter takes is tl.constexpr"
    local = {argument.arg for argument in arguments.args}
    local |= {node.id for node in ast.walk(function) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    if shadowed := local & (cell.triton | cell.language | cell.kernels):
        return (
            f"{sorted(shadowed)[0]} is a parameter or assigned in the kernel: it must stay Triton's (or the kernel's)"
        )
    known = local | cell.constants | cell.kernels | cell.triton | cell.language | BUILTINS | {"True", "False", "None"}
    pending: list[ast.AST] = list(function.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Raise) and _not_implemented(node):
            continue  # the blank's own line: the check says "not done" for it
        problem = _body_node_problem(node, cell, known)
        if problem:
            return f"line {getattr(node, 'lineno', function.lineno)}: {problem}"
        pending.extend(ast.iter_child_nodes(node))
    return None


def _body_node_problem(node: ast.AST, cell: _Cell, known: set[str]) -> str | None:
    if not isinstance(node, _FUNCTION_NODES):
        return (
            f"{type(node).__name__} is not part of Triton's language (a kernel's body holds no raise, try, with, "
            "lambda, comprehension, nested function, global or import)"
        )
    if isinstance(node, ast.Name) and node.id not in known:
        what = "Python, not Triton" if node.id in cell.modules else "not defined in this cell or this kernel"
        return f"{node.id} is {what}: a kernel computes with tl.*, its parameters and the cell's constants only"
    if isinstance(node, ast.Attribute):
        if node.attr.startswith("_"):
            return f"attribute {node.attr}: a kernel reaches no private or special attributes"
        if isinstance(node.value, ast.Name) and node.value.id in cell.kernels | cell.triton:
            if not (node.value.id in cell.triton and node.attr == "language"):
                return f"{ast.unparse(node)}: a kernel uses other kernels by calling them, and Triton through tl.*"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id not in BUILTINS | cell.kernels:
            return f"{node.func.id}(...) is not Triton: a kernel calls tl.* and the cell's other @triton.jit functions"
    return None


def _not_implemented(node: ast.Raise) -> bool:
    exc = node.exc
    target = exc.func if isinstance(exc, ast.Call) else exc
    return isinstance(target, ast.Name) and target.id == "NotImplementedError"
