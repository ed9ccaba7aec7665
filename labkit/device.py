"""The one place that decides which device and dtype labkit runs on.

CUDA if present, else Apple MPS, else CPU. ``LABKIT_DEVICE`` and ``LABKIT_DTYPE``
override the choice (for example ``LABKIT_DEVICE=cpu`` on a GPU machine).
fp32 on CPU by default (exact comparisons against transformers), bf16 on GPU.
"""

from __future__ import annotations

import os

import torch

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def default_device() -> torch.device:
    """The device labkit uses unless told otherwise."""
    wanted = os.environ.get("LABKIT_DEVICE")
    if wanted:
        try:
            return torch.device(wanted)
        except RuntimeError as err:
            raise ValueError(f"LABKIT_DEVICE={wanted!r} is not a device torch knows; "
                             "use cpu, cuda, cuda:1 or mps") from err
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


def available_ram_bytes() -> int:
    """Memory the OS could give this process now (Linux); elsewhere the physical total."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
