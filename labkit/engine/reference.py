"""The oracle for any engine: decode one request alone, and compare a batched run against it.

With greedy decoding a request says in any batch what it says alone, except after a near-tie (top two logits so
close that another batch shape's rounding may flip them): from there on the two runs may part ways.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

NEAR_TIE = 1e-4  # top-2 logit gap below which a differing greedy token is forgiven


@dataclass
class SoloRun:
    """Greedy tokens of one request decoded alone, the logits each was chosen from, and their top-2 gaps."""

    tokens: list[int]
    logits: list[torch.Tensor]
    gaps: list[float]


def solo_greedy(model, prompt_ids: list[int], max_tokens: int, ignore_eos: bool = False) -> SoloRun:
    """Decode one prompt alone with the model's dense contiguous cache (prefill, then decode), once per process."""
    return _solo_greedy(model, tuple(prompt_ids), max_tokens, ignore_eos)


@functools.lru_cache(maxsize=16)  # checks draw their prompts from short lists, and each seed and submission asks again
def _solo_greedy(model, prompt_ids: tuple[int, ...], max_tokens: int, ignore_eos: bool) -> SoloRun:
    eos = set() if ignore_eos else set(model.config.eos_token_ids)
    logits, cache = model.prefill(list(prompt_ids))
    last, run = logits[-1], SoloRun([], [], [])
    while True:
        top2 = torch.topk(last.float(), 2).values
        run.tokens.append(int(last.argmax()))
        run.logits.append(last)
        run.gaps.append(float(top2[0] - top2[1]))
        if run.tokens[-1] in eos or len(run.tokens) == max_tokens:
            return run
        last = model.decode(run.tokens[-1], cache)


def compare_to_solo(batched: list[int], solo: SoloRun, near_tie: float = NEAR_TIE) -> str | None:
    """None if ``batched`` matches the solo run (up to a near-tie), else a description of the difference."""
    for index, (got, want) in enumerate(zip(batched, solo.tokens)):
        if got != want:
            if solo.gaps[index] < near_tie:
                return None  # a near-tie: from here on the runs may differ
            return (
                f"token {index}: batched run chose {got}, alone it chose {want} "
                f"(top-2 gap {solo.gaps[index]:.2e}, not a near-tie)"
            )
    if len(batched) != len(solo.tokens):
        return f"batched run made {len(batched)} tokens, alone it made {len(solo.tokens)}"
    return None
