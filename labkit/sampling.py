"""Choosing the next token from logits: greedy, or seeded temperature / top-k / top-p sampling.

The settings themselves, :class:`SamplingParams`, live in :mod:`labkit.sampling_params` (no
torch), so the scheduler and the simulator can read them; they are re-exported here.
"""

from __future__ import annotations

import torch

from labkit.sampling_params import SamplingParams

__all__ = ["SamplingParams", "filtered_probabilities", "make_generator", "sample"]


def make_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A private random stream for one request, so its tokens do not depend on its batch mates."""
    if params.greedy:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(params.seed if params.seed is not None else torch.seed())
    return generator


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """One token per row of ``logits`` [N, V], each row with its own params and generator."""
    if not (len(params) == len(generators) == logits.shape[0]):
        raise ValueError(
            f"{logits.shape[0]} rows of logits need as many params and generators, "
            f"got {len(params)} and {len(generators)}"
        )
    chosen = logits.argmax(dim=-1)
    for row, (p, generator) in enumerate(zip(params, generators)):
        if not p.greedy:
            probs = filtered_probabilities(logits[row], p)
            chosen[row] = torch.multinomial(probs, 1, generator=generator)[0]
    return chosen


def filtered_probabilities(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Temperature-scaled probabilities with everything outside top-k and the top-p nucleus zeroed."""
    probs = torch.softmax(logits.float() / p.temperature, dim=-1)
    sorted_probs, order = probs.sort(descending=True)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if p.top_k:
        keep[p.top_k :] = False
    if p.top_p < 1.0:
        mass_before = sorted_probs.cumsum(0) - sorted_probs
        keep &= mass_before < p.top_p  # the token that crosses top_p is still kept
    filtered = torch.zeros_like(probs)
    filtered[order[keep]] = sorted_probs[keep]
    return filtered / filtered.sum()
