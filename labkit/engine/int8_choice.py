"""Which of PyTorch's int8 engines ``--quantization int8`` computes with here, and how fast that is against fp32.

Each engine is tried at every start (:func:`~labkit.models.int8_linear.try_backend`); the working one that runs the
default model's decode steps fastest, made as ``--quantization int8`` makes it and stepped in turns with the fp32
model, serves. One matmul of one shape did not predict that: it timed qnnpack at 0.9x fp32's speed on an AVX2 EPYC
where qnnpack's decode steps took 1.5x fp32's time. The timing is kept per machine (:mod:`labkit.kept_measurements`):
every start chooses the same engine, and says its speed over fp32, slower or not.

Each working engine is also timed with the rest of the model (embedding, norms, attention, the KV cache) in bf16
around its int8 linears, where oneDNN's bf16 linear works and matches fp32 here (the probe the serving dtype uses:
never a CPU's flags): on a CPU with native bf16 that rest is the larger part of a step, and in fp32 it read twice
the KV bytes. Where bf16 fails the probe, only the fp32 models are timed: the path as it was.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import replace

import torch

from labkit.kept_measurements import kept_measurement
from labkit.models import load_model
from labkit.models.fast_linear import probe_prepack
from labkit.models.int8_linear import ENGINE_VARIABLE, TOLERANCE, Int8Backend, candidate_engines, try_backend

# 32 short chats and 8 long conversations; an engine's speed is the lower of its two ratios, as for the serving
# dtype. Once the rest of the model may compute in bf16 (half the KV bytes), a long context no longer adds the same
# attention to every model's step: one busy run on the 2-core AMX Xeon had onednn 1.39x / 1.24x fp32 with the rest
# in fp32 and 1.27x / 1.63x with it in bf16 at 32 x 32 / 16 x 384 tokens. On the 2-core AVX2 EPYC the short batch
# alone (4 engines) took about 27 CPU seconds, a third of them building the models.
PROBE_BATCHES = ((32, 8), (8, 256))  # (sequences, context tokens)
DECODE_STEPS = 3  # timed decode steps per model, in turns
MEASUREMENT = "int8 decode-step speed over fp32"  # its name among the kept measurements (one matmul's had another)
_chosen: list[Int8Backend] = []


def decode_step_speeds(
    backends: list[Int8Backend],
    make_model: Callable = functools.partial(load_model, dtype="float32", progress=False),
    batches: tuple[tuple[int, int], ...] = PROBE_BATCHES,
    steps: int = DECODE_STEPS,
) -> dict[str, float]:
    """fp32's decode-step time over each engine's, the lower over ``batches``, per engine: ``make_model()`` (the
    default model in fp32) and its int8 versions as ``--quantization int8`` makes them, each batch (sequences,
    context) prefilled, then ``steps`` decode steps of each model in turns."""
    from labkit.engine.decode_timing import decode_ms_in_turns
    from labkit.engine.quantization import quantize_for_serving

    model = make_model()
    models = {"fp32": model}
    for backend in backends:
        models[backend.name] = quantize_for_serving(model, "int8", lambda backend=backend: backend)[0]
    ratios = []
    for batch_size, context in batches:
        times = decode_ms_in_turns(models, batch_size, context, steps)
        ratios.append({name: times["fp32"] / times[name] for name in models if name != "fp32"})
    return {name: round(min(ratio[name] for ratio in ratios), 3) for name in ratios[0]}


def bf16_works() -> bool:
    """Whether the rest of an int8 model may compute in bf16 here: oneDNN's packed bf16 linear works and matches."""
    return probe_prepack(torch.device("cpu"), torch.bfloat16).prepacked


def choose_int8_backend(
    candidates: Callable[[], list[tuple[str, bool]]] = candidate_engines,
    speeds: Callable[[list[Int8Backend]], dict[str, float]] = decode_step_speeds,
    remeasure: bool = False,
    bf16: Callable[[], bool] | None = None,
) -> Int8Backend:
    """The working quantized engine (with the rest of the model in fp32, or in bf16 where ``bf16()``, by default
    :func:`bf16_works`) whose decode
    steps are fastest here, with the reason and its speed over fp32; ``Int8Backend(None, ...)`` with every engine's
    failure where none works. Tried once per process.

    Every engine is checked at each start (cheap); ``speeds`` are timed only when none kept for this machine
    covers the working engines (or ``remeasure`` asks), and not at all for the one ``LABKIT_INT8_ENGINE`` names
    (it computes the rest in fp32).
    """
    default = candidates is candidate_engines and speeds is decode_step_speeds and bf16 is None
    if default and _chosen and not remeasure:
        return _chosen[0]
    working: dict[str, Int8Backend] = {}
    failures = []
    for engine, reduce_range in candidates():
        if engine in working:
            continue
        backend, why_not = try_backend(engine, reduce_range)
        if backend is None:
            failures.append(why_not)
        else:
            working[engine] = backend
    if not working:
        chosen = Int8Backend(None, False, "no int8 kernel works here (" + "; ".join(failures or ["none listed"]) + ")")
    elif os.environ.get(ENGINE_VARIABLE):
        (pinned,) = working.values()
        chosen = _described(
            pinned, f", named by {ENGINE_VARIABLE} (not timed), tried and within {TOLERANCE:.0%} of fp32"
        )
    else:
        chosen = _fastest(_with_bf16_around(working) if (bf16 or bf16_works)() else working, speeds, remeasure)
    if default:
        _chosen[:] = [chosen]
    return chosen


def _with_bf16_around(working: dict[str, Int8Backend]) -> dict[str, Int8Backend]:
    """``working``, and each engine again with the rest of the model in bf16 where its product on bf16 rows is
    within the tolerance too (by :attr:`Int8Backend.name`)."""
    both = dict(working)
    for backend in working.values():
        in_bf16, _ = try_backend(str(backend.engine), backend.reduce_range, torch.bfloat16)
        if in_bf16 is not None:
            both[in_bf16.name] = in_bf16
    return both


def _fastest(
    working: dict[str, Int8Backend], speeds: Callable[[list[Int8Backend]], dict[str, float]], remeasure: bool
) -> Int8Backend:
    """The working engine whose kept decode-step speed is highest (timed now if none kept covers them all)."""
    kept = kept_measurement(MEASUREMENT, lambda: speeds(list(working.values())), remeasure)
    if not set(working) <= set(kept.value):  # the engines that work here changed: time them again
        kept = kept_measurement(MEASUREMENT, lambda: speeds(list(working.values())), remeasure=True)
    speed = {name: float(kept.value[name]) for name in working}
    engine = max(working, key=lambda name: (speed[name], name))
    slower = ": int8 saves memory, not time, on this CPU" if speed[engine] < 1 else ""
    others = ", ".join(f"{name} {speed[name]:.2f}x" for name in sorted(working) if name != engine)
    return _described(
        working[engine],
        f", tried and within {TOLERANCE:.0%} of fp32; its decode steps (the slower of 32 short chats and "
        f"8 long conversations) measured "
        f"{speed[engine]:.2f}x fp32's speed{slower}{f' (also working: {others})' if others else ''}; "
        f"{kept.provenance()}",
    )


def _described(backend: Int8Backend, why: str) -> Int8Backend:
    """``backend`` with its reason for ``labkit info`` and the start-up line."""
    bits = " (7-bit activations)" if backend.reduce_range else ""
    around = ", the rest of the model in bf16" if backend.activations == torch.bfloat16 else ""
    return replace(backend, reason=f"{backend.engine} int8 kernels{bits}{around}{why}")
