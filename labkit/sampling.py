"""Choosing the next token from logits: greedy, or seeded temperature / top-k / top-p / min-p sampling.

The settings themselves, :class:`SamplingParams`, live in :mod:`labkit.sampling_params` (no
torch), so the scheduler and the simulator can read them; they are re-exported here. Before a
token is chosen, :func:`process_logits` applies a request's logits processors (penalties, a
bias, a minimum length), and :func:`token_logprob` reads a token's log-probability off the raw
logits; the model runner calls both only for the requests that ask, so the rest are untouched.
"""

from __future__ import annotations

import torch

from labkit.sampling_params import SamplingParams, TokenLogprob

__all__ = [
    "SamplingParams",
    "TokenLogprob",
    "filtered_probabilities",
    "make_generator",
    "process_logits",
    "sample",
    "token_logprob",
]


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
    """Temperature-scaled probabilities with everything outside top-k, the top-p nucleus and min-p zeroed."""
    probs = torch.softmax(logits.float() / p.temperature, dim=-1)
    sorted_probs, order = probs.sort(descending=True)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if p.top_k:
        keep[p.top_k :] = False
    if p.top_p < 1.0:
        mass_before = sorted_probs.cumsum(0) - sorted_probs
        keep &= mass_before < p.top_p  # the token that crosses top_p is still kept
    if p.min_p > 0:
        keep &= sorted_probs >= p.min_p * sorted_probs[0]  # the most likely token is always kept
    filtered = torch.zeros_like(probs)
    filtered[order[keep]] = sorted_probs[keep]
    return filtered / filtered.sum()


def process_logits(
    logits: torch.Tensor, p: SamplingParams, prompt_ids: list[int], output_ids: list[int], stop_ids: list[int]
) -> torch.Tensor:
    """One row of logits [V] after ``p``'s processors, as a new float32 row (vLLM's order and definitions).

    ``stop_ids`` are the tokens that would end the answer (end-of-text unless ``ignore_eos``, and
    ``stop_token_ids``): ``min_tokens`` forbids them until the output is that long.
    """
    row = logits.float().clone()
    if len(output_ids) < p.min_tokens and stop_ids:
        row[torch.tensor(stop_ids, device=row.device)] = -torch.inf
    if p.logit_bias:
        ids = torch.tensor(list(p.logit_bias), device=row.device)
        row[ids] += torch.tensor(list(p.logit_bias.values()), device=row.device)
    if p.repetition_penalty != 1.0:  # a seen token becomes less likely whatever its logit's sign
        seen = torch.tensor(sorted(set(prompt_ids) | set(output_ids)), dtype=torch.long, device=row.device)
        values = row[seen]
        row[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and output_ids:
        counts = torch.bincount(torch.tensor(output_ids, device=row.device), minlength=row.shape[0])[: row.shape[0]]
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
    return row


def token_logprob(logits: torch.Tensor, token_id: int, num_top: int) -> TokenLogprob:
    """``token_id``'s log-probability under one row of raw logits [V] (log_softmax at temperature 1),
    and the ``num_top`` most likely tokens', most likely first."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top = logprobs.topk(num_top) if num_top else None
    alternatives = () if top is None else tuple(zip(top.indices.tolist(), top.values.tolist()))
    return TokenLogprob(token_id, logprobs[token_id].item(), alternatives)
