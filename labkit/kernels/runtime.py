"""Triton, set up once for this machine: compiled on a GPU, run by its interpreter everywhere else.

Triton's interpreter (``TRITON_INTERPRET=1``) runs a kernel's programs one after another on the CPU
with NumPy, so a kernel written for a GPU can be checked for correctness on any laptop; it says
nothing about speed. The switch is read when a kernel is decorated, so it is set here, before any
kernel module of labkit's or a notebook's is defined. A canary (:func:`check_interpreter`) runs a
kernel whose answer is known first, so an interpreter broken in this environment (some torch,
triton and NumPy combinations have returned zeros) is named as such instead of failing a learner.
"""

from __future__ import annotations

import inspect
import os
from types import ModuleType

import torch


class TritonUnavailableError(RuntimeError):
    """Triton cannot run kernels here: not installed, or its interpreter gives wrong answers."""


COMPILE_ONLY_ENV = "LABKIT_TRITON_COMPILE_ONLY"  # set: kernels stay compilable for a GPU target, not runnable


def interpreted() -> bool:
    """Whether kernels run in Triton's interpreter: always without CUDA, or when TRITON_INTERPRET=1 is set."""
    return not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def load_triton() -> tuple[ModuleType, ModuleType]:
    """``triton`` and ``triton.language``, with the interpreter switched on where there is no GPU (unless
    :data:`COMPILE_ONLY_ENV` asks for kernels to compile for a GPU target: :mod:`~labkit.kernels.compile_for_gpu`)."""
    if not torch.cuda.is_available() and os.environ.get(COMPILE_ONLY_ENV) != "1":
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton
        import triton.language as tl
    except ImportError as err:
        raise TritonUnavailableError(
            f"Triton is not installed ({err}); install it with: pip install 'labkit[labs]' (or pip install triton)"
        ) from None
    return triton, tl


triton, tl = load_triton()


@triton.jit
def _add_one(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=inside) + 1.0, mask=inside)


def launch(kernel, grid: tuple[int, ...], **arguments) -> None:
    """``kernel[grid](**arguments)``, every argument by its parameter's name, with an error raised by the
    kernel's own code reported as itself.

    The interpreter wraps whatever a kernel raises (a blank's NotImplementedError, an IndexError) in its
    InterpreterError; unwrapped, it points at the line of the kernel that raised it. Only a ``@triton.jit``
    function with nothing hooked to its launch is launched: anything else could do its work in PyTorch.
    Arguments go by name, so a kernel whose parameters are in another order fails by name instead of
    reading one tensor as another.
    """
    _refuse_non_kernels(kernel)
    _check_parameters(kernel, arguments)
    check_interpreter()
    try:
        kernel[grid](**arguments)
    except Exception as error:
        if type(error).__name__ == "InterpreterError" and error.__cause__ is not None:
            raise error.__cause__ from None
        raise


def _check_parameters(kernel, arguments: dict[str, object]) -> None:
    """Raise a TypeError naming the parameters a kernel lacks or adds, against what its launcher passes."""
    parameters = inspect.signature(kernel.fn).parameters
    missing = [name for name in arguments if name not in parameters]
    unfilled = [name for name, p in parameters.items() if name not in arguments and p.default is p.empty]
    if missing or unfilled:
        raise TypeError(
            f"{kernel.__name__}({', '.join(parameters)}) does not take the arguments its launcher passes by name "
            f"({', '.join(arguments)}): "
            + "; ".join(
                part
                for part in (
                    f"it has no parameter {', '.join(missing)}" if missing else "",
                    f"nothing fills {', '.join(unfilled)}" if unfilled else "",
                )
                if part
            )
            + ". Keep the parameter names of the exercise's starter cell."
        )


def _refuse_non_kernels(kernel) -> None:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if not isinstance(kernel, (JITFunction, InterpretedFunction)):
        raise TypeError(
            f"{getattr(kernel, '__name__', type(kernel).__name__)} is a {type(kernel).__name__}, not a @triton.jit "
            "kernel: define it with @triton.jit in its exercise cell and run that cell again"
        )
    if getattr(kernel, "pre_run_hooks", None):
        raise ValueError(
            f"{kernel.__name__} has pre-run hooks (add_pre_run_hook): a kernel is launched alone, so remove them "
            "(run its exercise cell again)"
        )


_checked: list[bool] = []


def check_interpreter() -> None:
    """Run a two-program kernel with a known answer; raise :class:`TritonUnavailableError` if it is wrong.

    Called before any kernel is checked, once per process.
    """
    if _checked:
        return
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.arange(20, dtype=torch.float32, device=device)
    out = torch.zeros_like(x)
    _add_one[(2,)](x, out, 20, BLOCK=16)
    if not torch.equal(out.cpu(), torch.arange(1, 21, dtype=torch.float32)):
        mode = "interpreter" if interpreted() else "compiler"
        raise TritonUnavailableError(
            f"Triton's {mode} computed x + 1 wrongly here (got {out[:4].tolist()}... for 1, 2, 3, 4): this "
            f"environment (triton {triton.__version__}, torch {torch.__version__}) is broken, not your kernel; "
            "reinstall the pair labkit is tested with: a CPU build of torch==2.13.0 with triton==3.8.0 (`make setup` "
            "does), or a CUDA build with the Triton it pins"
        )
    _checked.append(True)
