"""How many experts a batch touches: why a mixture of experts stays memory-bound for larger batches.

A mixture-of-experts layer holds ``E`` expert MLPs; its router sends each token to ``k`` of them.
A decode step reads an expert's weights once if any token of the batch chose it, and not at all
otherwise. With routing spread evenly over the experts (what load-balancing losses train for), a
token leaves a given expert unchosen with probability 1 - k/E, so ``B`` tokens, each choosing on
its own, leave it unchosen with probability (1 - k/E)^B, and the expected number of distinct
experts touched is

    D(B) = E x (1 - (1 - k/E)^B)

D(1) = k (one token reads exactly its own experts) and D grows towards E, reaching 1 - 1/e (63%)
of the experts near B = E/k. Until it is near E, each token added to a batch brings new weights
to read, so the weight read is not yet shared as it is in a dense model. Real routers are not
uniform (popular experts are chosen more), which makes D smaller at every B: this is the
even-routing figure, and :func:`simulated_distinct_experts` draws the routing it assumes.
"""

from __future__ import annotations

import random


def expected_distinct_experts(tokens: float, experts: int, top_k: int) -> float:
    """Expected distinct experts among ``experts`` touched by ``tokens`` tokens choosing ``top_k`` each.

    E x (1 - (1 - k/E)^B) for uniform, independent routing; ``tokens`` may be fractional (an average).
    """
    _check_routing(experts, top_k)
    if tokens < 0:
        raise ValueError(f"tokens must be zero or more, got {tokens!r}")
    return experts * (1 - (1 - top_k / experts) ** tokens)


def weight_bytes_read(weight_bytes: float, experts: int, top_k: int, expert_bytes: float, tokens: float) -> float:
    """Weight bytes a pass of ``tokens`` tokens reads: all of a dense model (``experts`` 0); for a mixture, all of
    them less the experts no token chose, weight bytes - (E - D(tokens)) x expert bytes, so the active parameters
    at one token and every weight once the batch covers every expert."""
    if not experts:
        return weight_bytes
    return weight_bytes - (experts - expected_distinct_experts(max(tokens, 1), experts, top_k)) * expert_bytes


def simulated_distinct_experts(tokens: int, experts: int, top_k: int, trials: int = 200, seed: int = 0) -> float:
    """Mean distinct experts over ``trials`` seeded draws: each token picks ``top_k`` different experts at random."""
    _check_routing(experts, top_k)
    if not (isinstance(tokens, int) and tokens >= 1 and isinstance(trials, int) and trials >= 1):
        raise ValueError(f"tokens and trials must be whole numbers, 1 or more; got {tokens!r} and {trials!r}")
    rng = random.Random(seed)
    touched = 0
    for _ in range(trials):
        chosen: set[int] = set()
        for _ in range(tokens):
            chosen.update(rng.sample(range(experts), top_k))
        touched += len(chosen)
    return touched / trials


def _check_routing(experts: int, top_k: int) -> None:
    if not (isinstance(experts, int) and isinstance(top_k, int) and 1 <= top_k <= experts):
        raise ValueError(
            f"a router picks top_k of experts, 1 <= top_k <= experts; got top_k={top_k!r}, experts={experts!r} "
            "(num_experts_per_tok and the number of routed experts in the model's config.json)"
        )
