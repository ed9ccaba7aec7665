"""How a request picks its tokens and when it stops, as plain data (vLLM's names).

No torch here: the scheduler and the simulator read ``max_tokens`` and the stop rules, and
only :mod:`labkit.sampling` turns the rest into tensors.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    n: int = 1  # answers per prompt; they share the prompt's KV blocks through the prefix cache

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n (answers per prompt) must be a whole number >= 1, got {self.n!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
