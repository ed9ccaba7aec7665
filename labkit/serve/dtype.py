"""Which dtype `labkit serve` computes in here: bf16 where it is tried and measured faster, fp32 elsewhere.

The labs and the tests compare labkit with transformers token for token, in fp32, and never use
this. A server wants speed: on a CPU with native bf16 (AVX-512 BF16, AMX) oneDNN's bf16 matmuls
run several times faster than fp32, while on one without (AVX2 only) bf16 is emulated and slower.
So nothing is read from the CPU's flags: bf16 is chosen only if oneDNN's packed bf16 linear works
and matches ``F.linear`` here (the prepack probe), and the served model's own decode steps run at
least ``MIN_SPEEDUP`` times faster in bf16 than in fp32, both for a crowd of short chats and for a
few long conversations (``PROBE_BATCHES``): one small matmul said nothing of attention at long
contexts, where bf16 can be the slower. That timing is taken once per machine and kept
(:mod:`labkit.kept_measurements`): every later start reads the same ratio and makes the same choice,
however busy the machine is then.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from labkit.device import parse_dtype
from labkit.kept_measurements import kept_measurement
from labkit.models.fast_linear import probe_prepack

MIN_SPEEDUP = 1.1  # decode steps end to end, medians of several: less than this is within their noise
MEASUREMENT = "bf16 decode-step speed over fp32"  # its name among the kept measurements
PROBE_BATCHES = ((32, 32), (8, 256))  # (sequences, context tokens): many short chats, a few long conversations
DECODE_STEPS = 6  # timed decode steps per batch and dtype


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype the server computes in, and why, in words for its start-up line."""

    dtype: torch.dtype
    reason: str

    def describe(self) -> str:
        return f"{str(self.dtype).removeprefix('torch.')} ({self.reason})"


def _default_model_in(dtype: torch.dtype):
    from labkit.models import load_model

    return load_model(dtype=dtype, progress=False)


def measured_speedup(
    make_model: Callable = _default_model_in, batches=PROBE_BATCHES, steps: int = DECODE_STEPS
) -> float:
    """fp32 time over bf16 time of the engine's decode steps, the lower ratio over ``batches``: the default model
    (or ``make_model(dtype)``'s) in each dtype, each batch prefilled, then ``steps`` decode steps timed."""
    from labkit.engine.decode_timing import labkit_decode_ms

    models = {dtype: make_model(dtype) for dtype in (torch.float32, torch.bfloat16)}
    ratios = []
    for batch_size, context in batches:
        times = {dtype: labkit_decode_ms(model, batch_size, context, steps) for dtype, model in models.items()}
        ratios.append(times[torch.float32] / times[torch.bfloat16])
    return min(ratios)


def choose_serving_dtype(
    device: torch.device,
    asked: str | None = None,
    speedup: Callable[[], float] = measured_speedup,
    remeasure: bool = False,
) -> DtypeChoice:
    """The dtype for a server on `device`: what was asked (--dtype, then LABKIT_DTYPE), else the kept choice.

    ``speedup()`` is timed only when no measurement is kept for this machine, or ``remeasure`` asks for one.
    """
    if asked:
        return DtypeChoice(parse_dtype(asked), "asked for with --dtype")
    if os.environ.get("LABKIT_DTYPE"):
        return DtypeChoice(parse_dtype(os.environ["LABKIT_DTYPE"]), "LABKIT_DTYPE")
    if device.type != "cpu":
        return DtypeChoice(torch.bfloat16, f"{device.type}: bf16 is what accelerators serve in")
    path = probe_prepack(device, torch.bfloat16)
    if not path.prepacked:
        return DtypeChoice(torch.float32, f"no fast bf16 matmul on this CPU: {path.reason}")
    kept = kept_measurement(MEASUREMENT, lambda: {"speedup": round(speedup(), 3)}, remeasure)
    ratio = float(kept.value["speedup"])
    if ratio < MIN_SPEEDUP:
        return DtypeChoice(
            torch.float32,
            f"bf16 decode steps measured {ratio:.2f}x fp32's speed, under {MIN_SPEEDUP}x: fp32 is exact; "
            f"{kept.provenance()}",
        )
    return DtypeChoice(
        torch.bfloat16, f"bf16 decode steps measured {ratio:.2f}x fp32's speed on this CPU; {kept.provenance()}"
    )
