"""How long one decode step takes as the batch grows: HF's forward, labkit's paged engine, the bound.

The bound is the roofline of this machine: a decode step must read every weight and the
batch's KV cache once (bytes ÷ measured bandwidth) and do 2 × parameters FLOPs per
sequence (÷ measured matmul rate); it cannot be faster than the slower of the two.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from labkit.device import synchronize
from labkit.engine.decode_timing import labkit_decode_ms, random_prompts


@dataclass
class SweepPoint:
    batch_size: int
    hf_ms: float
    labkit_ms: float
    bound_ms: float

    @property
    def ratio(self) -> float:
        """labkit's step time over HF's: below 1 means labkit is faster."""
        return self.labkit_ms / self.hf_ms


def hf_decode_ms(model, batch_size: int, context: int, repeats: int) -> float:
    """Median time of one HF forward step with its own KV cache, after a prefill of ``context``."""
    ids = random_prompts(model, batch_size, context)
    with torch.inference_mode():
        out = model.hf(ids.to(model.device), use_cache=True)
        past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            out = model.hf(token, past_key_values=past, use_cache=True)
            synchronize(model.device)
            times.append(time.perf_counter() - start)
            past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
    return 1e3 * statistics.median(times)


def bound_ms(model, hardware, batch_size: int, context: int) -> float:
    """The roofline bound for one decode step of ``batch_size`` sequences at ``context`` tokens."""
    kv_bytes = batch_size * context * model.config.kv_bytes_per_token(model.dtype)
    memory_s = (model.weight_bytes() + kv_bytes) / hardware.bandwidth
    compute_s = 2 * model.num_parameters() * batch_size / hardware.flops
    return 1e3 * max(memory_s, compute_s)


def decode_sweep(
    model, hardware, batch_sizes=(1, 2, 4, 8, 16, 32, 64), context: int = 128, repeats: int = 8
) -> list[SweepPoint]:
    return [
        SweepPoint(
            b,
            hf_decode_ms(model, b, context, repeats),
            labkit_decode_ms(model, b, context, repeats),
            bound_ms(model, hardware, b, context),
        )
        for b in batch_sizes
    ]


def format_sweep(points: list[SweepPoint]) -> str:
    lines = [
        f"{'batch':>5} {'HF ms':>8} {'labkit ms':>10} {'labkit/HF':>9} {'bound ms':>9} "
        f"{'labkit tok/s':>12} {'bound tok/s':>11}"
    ]
    for p in points:
        lines.append(
            f"{p.batch_size:>5} {p.hf_ms:>8.1f} {p.labkit_ms:>10.1f} {p.ratio:>9.2f} {p.bound_ms:>9.1f} "
            f"{1e3 * p.batch_size / p.labkit_ms:>12.0f} {1e3 * p.batch_size / p.bound_ms:>11.0f}"
        )
    return "\n".join(lines)
