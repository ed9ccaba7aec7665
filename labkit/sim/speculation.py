"""Where speculative decoding pays: its speed-up against batch size, from the cost model.

A plain decode step reads the weights once for one token per sequence. A speculative step reads
them once for ``k + 1`` tokens per sequence and keeps, on average, ``(1 - a^(k+1)) / (1 - a)`` of
them (acceptance rate ``a``). While the pass is memory-bound the extra tokens are nearly free, so
the gain is close to that expectation; as the batch grows the pass turns arithmetic-bound, every
rejected draft costs arithmetic, and the speed-up falls below one. All of it is the cost model's
prediction (see :mod:`labkit.sim.cost_model`), not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from labkit.sim.cost_model import CostModel, ModelSpec, conversations_that_fit, expected_tokens_per_step, get_model
from labkit.sim.hardware import ACHIEVABLE_FLOPS_FRACTION, Hardware, get_hardware


@dataclass(frozen=True)
class SpeculationPoint:
    """Plain against speculative decoding at one batch size (cost-model figures)."""

    batch_size: int
    plain_step_s: float
    speculative_step_s: float
    tokens_per_step: float  # per sequence, with speculation (1 without)
    plain_tokens_per_s: float
    speculative_tokens_per_s: float
    verify_bound: str  # "memory" or "compute": what limits the verification pass
    fits_in_memory: bool  # the batch's KV cache fits beside the weights

    @property
    def speedup(self) -> float:
        return self.speculative_tokens_per_s / self.plain_tokens_per_s


def speculative_speedup(
    batch_sizes: Iterable[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
    *,
    k: int = 4,
    acceptance_rate: float = 0.7,
    hardware: Hardware | str = "h100-sxm",
    model: ModelSpec | str = "llama-3.1-8b",
    context_len: float = 1150,
    draft: ModelSpec | str | None = None,
    overhead_s: float = 0.001,
    flops_fraction: float = ACHIEVABLE_FLOPS_FRACTION,
    memory_fraction: float = 0.9,
) -> list[SpeculationPoint]:
    """Output tokens/s with and without speculation, for each batch size, on ``hardware``.

    Defaults: Llama 3.1 8B on an H100 SXM at half its peak arithmetic rate, a 1 ms
    overhead per pass, every sequence holding ``context_len`` tokens (the lesson's 1,000-token
    prompt halfway through a 300-token answer), prompt-lookup drafts (free; pass ``draft``, a
    smaller model, to charge its ``k`` passes per step). ``fits_in_memory`` says whether that many
    sequences' KV fits beside the weights: points past it are arithmetic, not a server you can run.
    """
    hardware, target = get_hardware(hardware), get_model(model)
    if not 0 < flops_fraction <= 1:
        raise ValueError(f"flops_fraction must be in (0, 1], got {flops_fraction}")
    if k < 1:
        raise ValueError(f"k (draft tokens per step) must be at least 1, got {k}")
    rate = flops_fraction * hardware.flops
    cost = CostModel.from_parts(hardware, target, overhead_s)
    cost = CostModel(**{**vars(cost), "flops": rate})
    draft_cost = None
    if draft is not None:
        draft_cost = CostModel.from_parts(hardware, get_model(draft), overhead_s)
        draft_cost = CostModel(**{**vars(draft_cost), "flops": rate})
    gained = expected_tokens_per_step(k, acceptance_rate)
    fit = conversations_that_fit(hardware.memory_bytes, memory_fraction, target, max(1, round(context_len)))
    points = []
    for batch in batch_sizes:
        if batch < 1:
            raise ValueError(f"batch sizes must be at least 1, got {batch}")
        plain = cost.decode_step_time(batch, context_len)
        speculative = cost.speculative_step_time(batch, context_len, k, draft_cost)
        verify = cost.pass_breakdown(batch * (k + 1), batch * context_len)
        points.append(
            SpeculationPoint(
                batch_size=batch,
                plain_step_s=plain,
                speculative_step_s=speculative,
                tokens_per_step=gained,
                plain_tokens_per_s=batch / plain,
                speculative_tokens_per_s=batch * gained / speculative,
                verify_bound=verify.bound,
                fits_in_memory=batch <= fit,
            )
        )
    return points


def speculation_breakeven_batch(max_batch: int = 4096, **settings) -> int | None:
    """The smallest batch size at which speculation is slower than plain decoding, or None up to ``max_batch``.

    ``settings`` are those of :func:`speculative_speedup`.
    """
    low, high = 1, max_batch
    if speculative_speedup([high], **settings)[0].speedup >= 1:
        return None
    if speculative_speedup([low], **settings)[0].speedup < 1:
        return low
    while high - low > 1:  # the speed-up falls with the batch: bisect for the crossing
        middle = (low + high) // 2
        if speculative_speedup([middle], **settings)[0].speedup < 1:
            high = middle
        else:
            low = middle
    return high


def format_speculation(points: list[SpeculationPoint]) -> str:
    """A plain-text table of :func:`speculative_speedup`'s points."""
    header = f"{'batch':>6}{'plain tok/s':>14}{'spec tok/s':>14}{'speed-up':>10}{'verify pass':>15}{'fits':>6}"
    lines = [header, "-" * len(header)]
    for p in points:
        lines.append(
            f"{p.batch_size:>6}{p.plain_tokens_per_s:>14,.0f}{p.speculative_tokens_per_s:>14,.0f}"
            f"{p.speedup:>9.2f}x{p.verify_bound + '-bound':>15}{'yes' if p.fits_in_memory else 'no':>6}"
        )
    return "\n".join(lines)
