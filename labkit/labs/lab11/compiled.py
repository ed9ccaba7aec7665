"""Lab 11's rule on a kernel cell's source: Triton's language only, and kernels that compile for an H100.

Read in the judging process, never run there: :func:`~labkit.labs.lab11.kernel_cell.kernel_cell_problem`
first (a cell that passes it has no side effects), then the cell is compiled for sm_90 in a child process
(:mod:`labkit.kernels.compile_for_gpu`), so Python that only Triton's interpreter accepts fails with the
compiler's own message and a hint naming the construct, and a block number multiplied in int32 is caught in
Triton's IR (:mod:`labkit.kernels.offset_types`). Where the compiler cannot run, the verdict says so in a note
and the interpreted outputs decide alone: a missing tool never fails a right answer.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from labkit.grading.result import Mismatch, Note
from labkit.kernels.compile_for_gpu import CompilerUnavailableError, Job, compile_in_child
from labkit.kernels.contract import GPU_SIGNATURES
from labkit.kernels.offset_types import int32_products
from labkit.labs.lab11.kernel_cell import PRELUDE, kernel_cell_problem

H100 = 90
RULE_HINT = (
    "The check launches your kernels itself and compiles them for a GPU: keep the exercise cell to the "
    "@triton.jit functions it asks for (and any @triton.jit helpers they call), written in tl.* only."
)
INTERPRETER_ONLY = {  # what Triton's compiler says -> the construct, and what to write instead
    "unsupported AST node type: Break": "a `break` out of a loop runs only in the interpreter: loop over exactly "
    "the blocks you need (end the range there) instead of leaving early.",
    "unsupported AST node type: Continue": "a `continue` runs only in the interpreter: mask the values you would "
    "skip (tl.where, or a load's mask) instead.",
    "Loop-carried variable": "a value carried through the loop changes type: one that starts as a Python float "
    "(m = float('-inf')) becomes a block of values inside. Start it as the block it will be: "
    "tl.zeros([GROUP_PAD], dtype=tl.float32) - float('inf').",
    "Cannot have `return` statements inside": "a `return` inside a loop runs only in the interpreter: let the loop "
    "end, then store.",
    "Boolean value of Tensor with more than one value is ambiguous": "a Python `if` on a block of values runs "
    "only in the interpreter: choose per element with tl.where(condition, a, b).",
}
INT32_HINT = (
    "Convert the block number to 64 bits before you multiply it: "
    "block = tl.load(block_tables_ptr + ...).to(tl.int64). At Llama-3.1-8B's shapes a block holds 16 x 8 x 128 "
    "elements, so from block 131,072 on an int32 product passes 2^31 and wraps to another block's address."
)


def kernel_rule(kernels: tuple[str, ...]) -> Callable[[str], Mismatch | Note | None]:
    """The source rule of an exercise whose cell defines ``kernels`` (with :data:`GPU_SIGNATURES`' parameters)."""

    def rule(source: str) -> Mismatch | Note | None:
        problem = kernel_cell_problem(source, kernels) or _parameters_problem(source, kernels)
        if problem:
            return Mismatch(problem, RULE_HINT)
        return compiled_problem(source, kernels)

    return rule


def _parameters_problem(source: str, kernels: tuple[str, ...]) -> str | None:
    functions = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}
    for name in kernels:
        wanted, given = list(GPU_SIGNATURES[name][0]), [argument.arg for argument in functions[name].args.args]
        if given != wanted:
            return f"{name}'s parameters are ({', '.join(given)}); the launcher passes ({', '.join(wanted)})"
    return None


def _short(error: str) -> str:
    """Triton's message with the kernel's lines cut to the three above the caret."""
    lines = error.splitlines()
    caret = next((index for index, line in enumerate(lines) if line.strip() == "^"), None)
    if caret is None or not lines[0].startswith("at "):
        return error
    return "\n".join(
        [f"{lines[0]} (line:column in the kernel)", *lines[max(1, caret - 3) : caret + 1], *lines[caret + 1 :]]
    )


def compiled_problem(source: str, kernels: tuple[str, ...]) -> Mismatch | Note | None:
    """What compiling the cell's ``kernels`` for an H100 finds wrong, a note when it cannot be compiled here, or None."""
    jobs = [Job(name, *GPU_SIGNATURES[name], H100, source=PRELUDE + source) for name in kernels]
    try:
        results = compile_in_child(jobs)
    except CompilerUnavailableError as error:
        return Note(f"{error}; your kernels were checked in Triton's interpreter only, not compiled for a GPU")
    except (TimeoutError, RuntimeError) as error:
        return Mismatch(f"your kernels could not be compiled for an H100 (sm_90): {error}", RULE_HINT)
    for result in results:
        if result.error:
            construct = next((hint for key, hint in INTERPRETER_ONLY.items() if key in result.error), None)
            return Mismatch(
                f"{result.kernel} does not compile for an H100 (sm_90); Triton's compiler says:\n{_short(result.error)}",
                construct
                or "Triton's interpreter runs Python that a GPU's compiler refuses: rewrite that line in tl.*.",
            )
    for result in results:
        if "block_tables_ptr" in GPU_SIGNATURES[result.kernel][0]:
            products = int32_products(result.ttir, "block_tables_ptr")
            if products:
                return Mismatch(
                    f"{result.kernel} multiplies the block number it loads as a 32-bit integer "
                    f"(Triton's IR: {products[0].split(' loc(')[0]})",
                    INT32_HINT,
                )
    return None
