"""Which dtype `labkit serve` computes in here: bf16 where it is tried and measured faster, fp32 elsewhere.

The labs and the tests compare labkit with transformers token for token, in fp32, and never use
this. A server wants speed: on a CPU with native bf16 (AVX-512 BF16, AMX) oneDNN's bf16 matmuls
run several times faster than fp32, while on one without (AVX2 only) bf16 is emulated and slower.
So nothing is read from the CPU's flags: bf16 is chosen only if oneDNN's packed bf16 linear works
and matches ``F.linear`` here (the prepack probe), and a decode-shaped product of the default
model's size, timed in both dtypes in turns, is at least ``MIN_SPEEDUP`` times faster in bf16.
That timing is taken once per machine and kept (:mod:`labkit.kept_measurements`): every later
start reads the same ratio and makes the same choice, however busy the machine is then.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from labkit.device import parse_dtype
from labkit.kept_measurements import kept_measurement
from labkit.models.fast_linear import prepacked_linear, probe_prepack

MIN_SPEEDUP = 1.3  # less than this is within what two noisy timings can disagree by
MEASUREMENT = "bf16 speed over fp32"  # its name among the kept measurements
PROBE_SHAPE = (32, 576, 1536)  # 32 sequences decoding through SmolLM2-135M's MLP up-projection
ROUNDS = 5


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype the server computes in, and why, in words for its start-up line."""

    dtype: torch.dtype
    reason: str

    def describe(self) -> str:
        return f"{str(self.dtype).removeprefix('torch.')} ({self.reason})"


def _seconds(fn: Callable[[], object], repeats: int = 20) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats


def measured_speedup(shape: tuple[int, int, int] = PROBE_SHAPE, rounds: int = ROUNDS) -> float:
    """fp32 time over bf16 time of one packed linear of `shape` (rows, in, out): medians of rounds taken in turns."""
    rows, columns, outputs = shape
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(outputs, columns, generator=generator) * 0.05
    x = torch.randn(rows, columns, generator=generator)
    linears = {dtype: prepacked_linear(weight.to(dtype)) for dtype in (torch.float32, torch.bfloat16)}
    inputs = {dtype: x.to(dtype) for dtype in linears}
    times: dict[torch.dtype, list[float]] = {dtype: [] for dtype in linears}
    with torch.inference_mode():
        for dtype in linears:  # warm up: the first calls allocate and pick kernels
            linears[dtype](inputs[dtype])
        for _ in range(rounds):
            for dtype in linears:
                times[dtype].append(_seconds(functools.partial(linears[dtype], inputs[dtype])))
    return statistics.median(times[torch.float32]) / statistics.median(times[torch.bfloat16])


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
            torch.float32, f"bf16 measured {ratio:.2f}x fp32, under {MIN_SPEEDUP}x: fp32 is exact; {kept.provenance()}"
        )
    return DtypeChoice(
        torch.bfloat16, f"bf16 measured {ratio:.2f}x fp32 on this CPU, and matches it; {kept.provenance()}"
    )
