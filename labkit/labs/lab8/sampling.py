"""Judging a speculative-sampling rule by the distribution it produces (lab 8).

The rule is random, so no single output is right or wrong: the first token it returns must be distributed exactly
as the target's own ``p``. The typical wrong rules give other, known distributions, computed here exactly, so a
failing rule can be named by the one its frequencies are closest to.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# How each known rule decides: accept the drafted token x with some probability, else resample.
# Each entry: (accept probability of x given p and q, the distribution resampled from on a reject).
RULES: dict[str, tuple[Callable, Callable]] = {
    "correct": (
        lambda p, q, x: min(1.0, float(p[x] / q[x])),
        lambda p, q: _normalised(torch.clamp(p - q, min=0.0)),
    ),
    "accept with p": (lambda p, q, x: float(p[x]), lambda p, q: _normalised(torch.clamp(p - q, min=0.0))),
    "resample from p": (lambda p, q, x: min(1.0, float(p[x] / q[x])), lambda p, q: p),
    "ratio upside down": (
        lambda p, q, x: min(1.0, float(q[x] / p[x])) if p[x] > 0 else 1.0,
        lambda p, q: _normalised(torch.clamp(p - q, min=0.0)),
    ),
    "the draft's own probabilities": (lambda p, q, x: 1.0, lambda p, q: q),
}

MISTAKE_HINTS = {
    "accept with p": "Your rule accepts a drafted token x with probability p(x). The rule is min(1, p(x) / q(x)): "
    "a token the draft over-proposes (q(x) > p(x)) must be accepted less often, one it under-proposes always.",
    "resample from p": "On a rejection your rule samples from p. It must sample from max(0, p - q), normalised: "
    "the tokens the draft under-proposed. Sampling from p counts the accepted mass twice.",
    "ratio upside down": "Your rule accepts a drafted token x with probability min(1, q(x) / p(x)): the ratio is "
    "upside down. It is the target's over the draft's, min(1, p(x) / q(x)): a token the draft over-proposes "
    "(q(x) > p(x)) must be accepted less often, not always.",
    "the draft's own probabilities": "Your rule accepts every drafted token, as if it compared the draft with its "
    "own probabilities (p / q = 1). The ratio must use the target's probabilities p, from the verification pass.",
}


def _normalised(weights: torch.Tensor) -> torch.Tensor:
    total = weights.sum()
    return weights / total if total > 0 else weights


def first_token_distribution(p: torch.Tensor, q: torch.Tensor, rule: str) -> torch.Tensor:
    """The exact distribution of the first token a rule returns, when the draft token is drawn from q."""
    accept, residual = RULES[rule]
    rest = residual(p, q)
    out = torch.zeros_like(p)
    for x in range(p.shape[0]):
        if q[x] <= 0:
            continue
        a = accept(p, q, x)
        out[x] += q[x] * a
        out += q[x] * (1 - a) * rest
    return out


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def frequencies(tokens: list[int], vocab: int) -> torch.Tensor:
    counts = torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=vocab)[:vocab].double()
    return counts / max(len(tokens), 1)


def closest_rule(p: torch.Tensor, q: torch.Tensor, seen: torch.Tensor) -> tuple[str, float]:
    """The known rule whose first-token distribution is nearest to the frequencies seen, and its distance."""
    distances = {rule: total_variation(first_token_distribution(p, q, rule), seen) for rule in RULES}
    rule = min(distances, key=distances.get)
    return rule, distances[rule]
