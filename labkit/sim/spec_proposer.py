"""Speculative decoding on the cost model's clock: drafts are placeholders, acceptance is a coin per token.

The engine's step loop proposes, schedules 1 + k tokens, and rolls back rejected KV exactly as for the
real model; only what a draft *is* differs. Each draft token is accepted with probability
``acceptance_rate`` until the first rejection (Leviathan et al.'s independence assumption), drawn from
a seeded stream so a simulation repeats.
"""

from __future__ import annotations

import random

from labkit.speculative import SpeculativeConfig

PLACEHOLDER_DRAFT = 0  # the cost model never looks at token values
SEED = 0


class SimulatedProposer:
    """Proposes ``k`` placeholder drafts per decoding request and decides how many the "target" accepts."""

    def __init__(self, config: SpeculativeConfig):
        if config.acceptance_rate is None:
            raise ValueError(
                "simulating speculative decoding needs 'acceptance_rate' in speculative_config (the chance that "
                "each draft token is accepted, e.g. 0.7); the cost model cannot guess it"
            )
        if config.method == "draft_model" and config.model is not None and not hasattr(config.model, "pass_time"):
            raise ValueError(
                "in simulate, a draft model is priced by its CostModel: pass 'model': CostModel.from_parts(hardware, "
                "draft_spec), or leave 'model' out to draft for free"
            )
        self.config = config
        self.num_speculative_tokens = config.k
        self._random = random.Random(SEED)

    def propose(self, request, k: int) -> tuple[list[int], object]:
        return [PLACEHOLDER_DRAFT] * k, None

    def verify(self, batch, request_id: str) -> int | list[int]:
        """The accepted drafts and one target token for a speculating sampler; a plain token otherwise."""
        request = next(r for r, _ in batch.work if r.request_id == request_id)
        drafts = request.spec_token_ids
        if not drafts:
            return PLACEHOLDER_DRAFT
        rate = self.config.acceptance_rate
        assert rate is not None, "__init__ refused a config without one"
        accepted = 0
        while accepted < len(drafts) and self._random.random() < rate:
            accepted += 1
        return drafts[:accepted] + [PLACEHOLDER_DRAFT]

    def rollback(self, request, num_rejected: int, blocks) -> None:
        self.config.rollback(request, num_rejected, blocks)

    def drafting_time(self, batch) -> float:
        """Seconds the draft model spends on this step: k one-token passes over the speculating requests."""
        draft_cost = self.config.model
        speculating = [r for r, _ in batch.work if r.spec_token_ids]
        if draft_cost is None or not speculating:
            return 0.0
        context = sum(r.num_computed_tokens for r in speculating)
        return max(len(r.spec_token_ids) for r in speculating) * draft_cost.pass_time(len(speculating), context)
