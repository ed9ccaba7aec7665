"""A CUDA device on a machine without one: proof that code puts its tensors where CUDA code would run.

Inside :func:`stand_in_cuda`, a tensor made for ``cuda:0`` is a CPU tensor that says it lives on cuda:0
(:class:`OnCuda`), and an operation that mixes one with a CPU tensor is recorded and raises, as CUDA
does ("Expected all tensors to be on the same device"); so does a random draw whose generator is on the
other device (a CPU generator for a cuda:0 tensor, or a cuda one drawing on the CPU: ``torch.rand`` without
``device=``). The values are real, so code that branches on them (argmax, ``.item()``, sampling) runs
as it would on a GPU: only the device is pretended. PyTorch's fake tensors raise on the same mismatch but
carry no values, so they cannot run a decode loop; this stand-in can.

What CUDA itself allows is allowed: a 0-dim CPU tensor as a scalar operand, CPU indices into a cuda
tensor, and explicit copies between the devices (``.to``, ``.cpu()``, ``copy_``).

Two things torch's modes do not reach are followed too: a thread started inside (a server's engine loop, its
HTTP clients) runs on the stand-in as the thread that started it does; and a Triton kernel launched through
labkit's ``launch`` must be handed cuda:0 tensors only, as a GPU's kernel must ("Pointer argument cannot be
accessed from Triton (cpu tensor?)"), before Triton's interpreter runs it on their CPU data.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.weak import WeakIdKeyDictionary

from labkit.device import use_cpu_threads

CUDA = torch.device("cuda", 0)  # with its index: a device without one asks a CUDA runtime which is current
# What the stand-in tensors are to torch's C++ (device guards, `.to`'s shortcuts): a device with no data, as
# fake tensors are; Python code is told cuda:0.
_BACKEND = torch.device("meta")
_HOST = torch.device("cpu")  # where the stand-in's data lives

aten = torch.ops.aten
# Operations CUDA runs with operands on both devices: copies between them, and indexing with CPU indices.
_COPIES = {aten._to_copy.default, aten.copy_.default, aten.lift_fresh.default}
_INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}

_TORCH_DIR = str(Path(torch.__file__).parent)
_HERE = str(Path(__file__))


class OnCuda(torch.Tensor):
    """A CPU tensor (``host``) that reports cuda:0 as its device; every operation on it goes through the stand-in."""

    host: torch.Tensor

    @staticmethod
    def __new__(cls, host: torch.Tensor):
        made = torch.Tensor._make_wrapper_subclass(
            cls,
            host.size(),
            strides=host.stride(),
            storage_offset=host.storage_offset(),
            dtype=host.dtype,
            device=_BACKEND,
            requires_grad=host.requires_grad,
        )
        made.host = host
        return made

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"a stand-in cuda:0 tensor reached {func} after the stand-in device was put away")

    @property
    def device(self) -> torch.device:
        return CUDA

    is_cuda = property(lambda self: True)
    is_cpu = property(lambda self: False)
    is_meta = property(lambda self: False)

    def get_device(self) -> int:
        return 0

    # Python lists as indices: torch's C++ would turn them into index tensors on the C++ device, which here
    # has no data; made by torch.tensor instead, they reach the stand-in with their values
    def __getitem__(self, index):
        return super().__getitem__(_list_indices(index))

    def __setitem__(self, index, value) -> None:
        super().__setitem__(_list_indices(index), value)

    # What reads the data directly, not through an operation, as CUDA tensors allow it
    def tolist(self):
        return self.host.tolist()

    def data_ptr(self) -> int:
        return self.host.data_ptr()

    def untyped_storage(self):
        return self.host.untyped_storage()

    def numpy(self, *, force: bool = False):
        raise TypeError(
            "can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first."
        )

    def __array__(self, dtype=None, copy=None):
        return self.numpy()

    def __repr__(self) -> str:
        return f"{self.host!r} (stand-in for cuda:0)"


def _list_indices(index):
    """``index`` with each list in it (of ints or bools) made a cuda:0 tensor."""
    if isinstance(index, tuple):
        return tuple(_list_indices(item) for item in index)
    return torch.tensor(index, device=CUDA) if isinstance(index, list) else index


class StandInGenerator(torch.Generator):
    """A CPU random generator that says it belongs to cuda:0: what ``torch.Generator(device="cuda")`` makes here."""

    @property
    def device(self) -> torch.device:
        return CUDA


_REAL_GENERATOR = torch.Generator


class _Generator(torch.Generator):
    """``torch.Generator`` as the stand-in has it: a cuda one is a :class:`StandInGenerator`."""

    def __new__(cls, device: torch.device | str | int = "cpu"):
        return StandInGenerator() if torch.device(device).type == "cuda" else _REAL_GENERATOR(device)


@dataclass(frozen=True)
class DeviceMismatch:
    """One operation that CUDA would have refused: where it ran, and which CPU operands it got."""

    context: str  # what was running (the walk says which lab and exercise)
    operation: str
    called_at: str
    cpu_operands: tuple[str, ...]  # each: its dtype and shape, and where it was made
    drew: tuple[str, str] | None = None  # a random draw's (device, generator's device), when they differ

    def __str__(self) -> str:
        if self.drew is not None:
            device, generator = self.drew
            return (
                f"{self.context}: {self.operation} at {self.called_at} drew on {device} from a random generator on "
                f"{generator}; on a GPU this raises 'Expected a '{torch.device(device).type}' device type for "
                f"generator but found '{torch.device(generator).type}''"
            )
        operands = "; ".join(self.cpu_operands)
        return (
            f"{self.context}: {self.operation} at {self.called_at} got a CPU tensor beside cuda:0 ones "
            f"({operands}); on a GPU this raises 'Expected all tensors to be on the same device'"
        )


class StandInCudaError(RuntimeError):
    """Raised where CUDA would raise: an operation given tensors (or a generator) on both devices."""


class StandInLimitError(RuntimeError):
    """Raised where the stand-in cannot follow what torch does (not NotImplementedError: a check reads that as
    an exercise not done yet)."""


def _outside_torch() -> str:
    """The first caller that is neither torch nor this file, as ``file:line (function)``."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith((_TORCH_DIR, _HERE)):
        frame = frame.f_back
    if frame is None:
        return "an unknown place"
    filename = frame.f_code.co_filename.removeprefix(f"{Path(__file__).parents[1]}/")  # from the repository's root
    return f"{filename}:{frame.f_lineno} ({frame.f_code.co_name})"


class StandInCuda:
    """What the stand-in saw: each operation CUDA would have refused, and what was running at the time."""

    def __init__(self):
        self.context = "the stand-in device"  # the walk sets it to the lab and exercise it runs
        self.mismatches: list[DeviceMismatch] = []
        self.made_at: WeakIdKeyDictionary = WeakIdKeyDictionary()  # CPU tensor -> where it was made

    def refuse(self, operation: str, cpu: list[torch.Tensor], drew: tuple[str, str] | None = None) -> None:
        operands = [
            f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)} made at {self.made_at.get(t, 'an unknown place')}"
            for t in cpu
        ]
        mismatch = DeviceMismatch(self.context, operation, _outside_torch(), tuple(operands), drew)
        self.mismatches.append(mismatch)
        raise StandInCudaError(str(mismatch))


def _flat(values):
    """The operands of an operation: aten's arguments are values or lists of them, never deeper."""
    for value in values:
        if isinstance(value, (list, tuple)):
            yield from value
        else:
            yield value


def _unwrap(value, hosts: dict[int, OnCuda]):
    """``value`` as the CPU runs it: a stand-in's host tensor (noted in ``hosts``), the CPU for a device."""
    if isinstance(value, OnCuda):
        hosts[id(value.host)] = value
        return value.host
    if isinstance(value, torch.device):
        return _HOST
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(item, hosts) for item in value)
    return value


class _Operations(TorchDispatchMode):
    """Runs every operation on the CPU, keeps cuda:0 tensors wrapped, and refuses one that mixes the devices."""

    def __init__(self, seen: StandInCuda):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = list(_flat((*args, *kwargs.values())))
        asked = [torch.device(value).type for value in leaves if isinstance(value, torch.device)]
        given_cuda = any(isinstance(value, OnCuda) for value in leaves)
        if any(type(value) is torch.Tensor and value.is_meta for value in leaves):
            raise StandInLimitError(f"{func} got a tensor torch made on the stand-in's C++ device, without values")
        if given_cuda and func not in _COPIES:
            # CPU indices into a cuda tensor are fine, as CUDA has them (aten's indexing takes them as args[1])
            operands = leaves if func not in _INDEXING else list(_flat((args[0], *args[2:], *kwargs.values())))
            cpu = [value for value in operands if type(value) is torch.Tensor and value.dim() > 0]
            if cpu:
                self.seen.refuse(str(func), cpu)
        # where the result lives: the device the operation was asked for, else its operands'
        asked_cuda = bool(asked) and asked[-1] in ("cuda", _BACKEND.type)
        on_cuda = asked_cuda if asked else given_cuda
        hosts: dict[int, OnCuda] = {}
        out = func(*_unwrap(args, hosts), **{key: _unwrap(value, hosts) for key, value in kwargs.items()})
        if func in _INPLACE_VIEWS and given_cuda:  # on CPU tensors alone, torch reshapes them as it likes
            raise StandInLimitError(f"the stand-in device cannot follow {func}, which reshapes a tensor in place")
        given = {id(value) for value in leaves if type(value) is torch.Tensor}
        if isinstance(out, (list, tuple)):
            return type(out)(self._result(t, hosts, given, on_cuda, asked_cuda) for t in out)
        return self._result(out, hosts, given, on_cuda, asked_cuda)

    def _result(self, tensor, hosts: dict[int, OnCuda], given: set[int], on_cuda: bool, asked_cuda: bool):
        """An operation's result as CUDA would return it: the very tensor it was given back when it returns that
        one (in place, or ``.to`` the device it is on), a cuda:0 tensor when on cuda, else a CPU one; a move
        between the devices is a copy, never the same data on both."""
        if not isinstance(tensor, torch.Tensor):
            return tensor
        if id(tensor) in hosts:
            return hosts[id(tensor)] if on_cuda else tensor.clone()
        if id(tensor) in given:
            return OnCuda(tensor.clone()) if asked_cuda else tensor
        if on_cuda:
            # Not an inference tensor, whatever the mode: torch gives a view of a normal tensor its base's version
            # counter, which an inference tensor cannot take (a real CUDA view is made below that step).
            with torch.inference_mode(False):
                return OnCuda(tensor)
        self.seen.made_at[tensor] = _outside_torch()
        return tensor


class _Generators(TorchFunctionMode):
    """Refuses a random draw whose generator is on the other device than the numbers it draws, as CUDA does.

    Here, not in :class:`_Operations`: a generator reaches the dispatcher as a new object, its stand-in gone.
    """

    def __init__(self, seen: StandInCuda):
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        generator = kwargs.get("generator")
        if generator is not None:
            asked = kwargs.get("device")
            tensors = [value for value in _flat(args) if isinstance(value, torch.Tensor)]
            device = torch.device(asked) if asked is not None else tensors[0].device if tensors else torch.device("cpu")
            if device.type != generator.device.type:
                drew = (str(device), str(generator.device))
                self.seen.refuse(getattr(func, "__name__", str(func)), [], drew)
        return func(*args, **kwargs)


_INPLACE_VIEWS = {aten.unsqueeze_.default, aten.squeeze_.dim, aten.transpose_.default, aten.t_.default}


def _device_properties(device=None):
    return types.SimpleNamespace(name="stand-in CUDA device", total_memory=80 * 2**30, multi_processor_count=132)


_THREAD_START = threading.Thread.start


def _start_on_stand_in(seen: StandInCuda):
    """``Thread.start`` for threads started inside the stand-in: torch's modes (and how it makes a tensor from
    data) hold in the thread that set them only, so each new thread sets its own (a mode object is entered by
    one thread)."""

    def start(thread: threading.Thread) -> None:
        run = thread.run

        def run_on_stand_in() -> None:
            torch._C._set_only_lift_cpu_tensors(True)  # thread-local too: see stand_in_cuda
            with _Operations(seen), _Generators(seen):
                run()

        thread.run = run_on_stand_in  # type: ignore[method-assign]
        _THREAD_START(thread)

    return start


def _launch_on_stand_in(seen: StandInCuda, launch):
    """labkit's kernel ``launch`` as a GPU has it: a tensor argument on the CPU is refused (a compiled kernel
    cannot read host memory); the kernel then runs in Triton's interpreter on the cuda:0 tensors' CPU data,
    outside the stand-in's modes, and what it stores is what their stand-ins hold."""

    def launch_on_stand_in(kernel, grid, **arguments) -> None:
        cpu = [arg for arg in arguments.values() if isinstance(arg, torch.Tensor) and not isinstance(arg, OnCuda)]
        if cpu:
            seen.refuse(f"the Triton kernel {getattr(kernel, '__name__', kernel)}", cpu)
        hosts = {name: arg.host if isinstance(arg, OnCuda) else arg for name, arg in arguments.items()}
        with _disable_current_modes():
            launch(kernel, grid, **hosts)

    return launch_on_stand_in


def _kernel_launchers() -> list[tuple[types.ModuleType, str]]:
    """Where labkit's kernels are launched from: each module (already imported) whose ``launch`` is labkit's."""
    runtime = sys.modules.get("labkit.kernels.runtime")
    if runtime is None:
        return []
    return [
        (module, "launch")
        for name, module in list(sys.modules.items())
        if name.startswith("labkit") and getattr(module, "launch", None) is runtime.launch
    ]


_MODULE_TO = torch.nn.Module.to


def _module_to(module: torch.nn.Module, *args, **kwargs):
    """``nn.Module.to`` outside inference mode: inside it, torch would set each parameter's data to the stand-in's
    own (a tensor without data) instead of making the parameter the stand-in; a real CUDA tensor has no such gap."""
    with torch.inference_mode(False):
        return _MODULE_TO(module, *args, **kwargs)


@contextlib.contextmanager
def stand_in_cuda() -> Iterator[StandInCuda]:
    """While inside, cuda:0 exists (on the CPU), labkit's device is cuda:0, and every mismatch is recorded."""
    seen = StandInCuda()
    with contextlib.ExitStack() as stack:
        patches = {
            "_lazy_init": lambda: None,
            "synchronize": lambda device=None: None,
            "mem_get_info": lambda device=None: (70 * 2**30, 80 * 2**30),
            "memory_allocated": lambda device=None: 0,
            "get_device_name": lambda device=None: "stand-in CUDA device",
            "get_device_properties": _device_properties,
        }
        for name, value in patches.items():
            stack.enter_context(mock.patch.object(torch.cuda, name, value))
        stack.enter_context(mock.patch.object(torch, "Generator", _Generator))
        stack.enter_context(mock.patch.object(torch.nn.Module, "to", _module_to))
        stack.enter_context(mock.patch.object(threading.Thread, "start", _start_on_stand_in(seen)))
        for module, name in _kernel_launchers():
            stack.enter_context(mock.patch.object(module, name, _launch_on_stand_in(seen, getattr(module, name))))
        stack.enter_context(mock.patch.dict("os.environ", {"LABKIT_DEVICE": "cuda:0"}))
        threads = torch.get_num_threads()
        use_cpu_threads()  # what labkit does on the CPU, where the stand-in runs
        stack.callback(torch.set_num_threads, threads)
        lift = torch._C._only_lift_cpu_tensors()
        torch._C._set_only_lift_cpu_tensors(True)  # torch.tensor(..., device=cuda) is made on the CPU, then moved
        stack.callback(torch._C._set_only_lift_cpu_tensors, lift)
        stack.enter_context(_Operations(seen))
        stack.enter_context(_Generators(seen))
        yield seen
