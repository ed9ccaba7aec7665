"""The one place that decides which device and dtype labkit runs on.

CUDA if present, else Apple MPS, else CPU. ``LABKIT_DEVICE`` and ``LABKIT_DTYPE``
override the choice (for example ``LABKIT_DEVICE=cpu`` on a GPU machine).
fp32 on CPU by default (exact comparisons against transformers), bf16 on GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def default_device() -> torch.device:
    """The device labkit uses unless told otherwise."""
    wanted = os.environ.get("LABKIT_DEVICE")
    if wanted:
        try:
            return torch.device(wanted)
        except RuntimeError as err:
            raise ValueError(
                f"LABKIT_DEVICE={wanted!r} is not a device torch knows; use cpu, cuda, cuda:1 or mps"
            ) from err
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def default_dtype(device: torch.device | None = None) -> torch.dtype:
    """fp32 on CPU, bf16 on an accelerator; ``LABKIT_DTYPE`` overrides."""
    wanted = os.environ.get("LABKIT_DTYPE")
    if wanted:
        return parse_dtype(wanted)
    device = device or default_device()
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """Turn 'bf16', 'float32', ... into a torch dtype, with a clear error otherwise."""
    if isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(_DTYPES)}") from None


def synchronize(device: torch.device | str) -> None:
    """Wait until the device has finished its queued work, so a timer around it measures the work.

    CUDA and MPS run kernels asynchronously: without this, a timed call returns as soon as
    its kernels are queued. On the CPU there is nothing to wait for.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def available_ram_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Memory the OS could give this process now: Linux's MemAvailable, which counts the page cache it
    would drop (free memory alone shrinks whenever files were read, so a pool sized on it would change
    from one run to the next); elsewhere the physical total."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the kernel writes kB, meaning KiB
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


# --- the CPU: what it offers, and how many threads torch uses on it -------------------------

# /proc/cpuinfo flags (x86 "flags", ARM "Features") behind the fast paths that matter here.
_ISA_FLAGS = {
    "AVX2": ("avx2",),
    "AVX-512": ("avx512f",),
    "AMX": ("amx_tile",),
    "native bf16": ("avx512_bf16", "amx_bf16", "avx_ne_convert", "bf16"),
}


def _cpuinfo() -> dict[str, str]:
    """The first processor's entries of /proc/cpuinfo (Linux); empty elsewhere."""
    entries: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                key, _, value = line.partition(":")
                entries.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    return entries


def cpu_features() -> dict:
    """The CPU's name and the instruction-set features that decide which matmul kernels are fast.

    For telling the learner what runs and why; labkit never chooses a path from these (it tries).
    """
    import platform

    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("features") or "").split())
    name = info.get("model name") or info.get("hardware") or platform.processor() or platform.machine()
    features = {
        feature: (any(flag in flags for flag in names) if flags else None) for feature, names in _ISA_FLAGS.items()
    }
    return {"cpu": name, "kernels torch dispatches to": torch.backends.cpu.get_cpu_capability(), **features}


_TORCH_DEFAULT_THREADS = torch.get_num_threads()  # one per physical core, as torch counts them


def cpu_threads() -> tuple[int, str]:
    """How many threads torch should use on the CPU, and why.

    One core is left to the rest of the machine: a learner's laptop is rarely idle, and when
    another program takes a core that torch's threads also want, every parallel matmul waits
    for the thread that lost its core (several times slower). ``LABKIT_THREADS`` overrides.
    """
    wanted = os.environ.get("LABKIT_THREADS")
    if wanted:
        if not wanted.isdigit() or int(wanted) < 1:
            raise ValueError(
                f"LABKIT_THREADS={wanted!r} is not a positive whole number; "
                "set it to the number of threads torch should use, e.g. LABKIT_THREADS=2"
            )
        return int(wanted), "set by LABKIT_THREADS"
    cores = _TORCH_DEFAULT_THREADS
    if cores <= 1:
        return 1, "one core"
    return cores - 1, f"one of {cores} cores left free for other programs"


def use_cpu_threads() -> int:
    """Set torch's thread count to :func:`cpu_threads`' choice; returns it."""
    threads, _ = cpu_threads()
    torch.set_num_threads(threads)
    return threads
