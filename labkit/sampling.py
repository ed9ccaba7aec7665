"""Choosing the next token from logits: greedy, or seeded temperature / top-k / top-p sampling."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks tokens and when it stops (names as in vLLM)."""

    max_tokens: int = 64
    temperature: float = 0.0  # 0 means greedy: always the most likely token
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator | None:
        """A private random stream for this request, so results do not depend on batch mates."""
        if self.greedy:
            return None
        generator = torch.Generator(device=device)
        generator.manual_seed(self.seed if self.seed is not None else torch.seed())
        return generator


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of ``logits`` [N, V], each row with its own params and generator."""
    if not (len(params) == len(generators) == logits.shape[0]):
        raise ValueError(f"{logits.shape[0]} rows of logits need as many params and generators, "
                         f"got {len(params)} and {len(generators)}")
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
        keep[p.top_k:] = False
    if p.top_p < 1.0:
        mass_before = sorted_probs.cumsum(0) - sorted_probs
        keep &= mass_before < p.top_p  # the token that crosses top_p is still kept
    filtered = torch.zeros_like(probs)
    filtered[order[keep]] = sorted_probs[keep]
    return filtered / filtered.sum()
