"""The solo oracle in one pass: a batched answer checked token by token against the model alone on the same text.

Decoding a prompt alone (``labkit.engine.reference.solo_greedy``) takes one model step per token. The same verdict
comes from one prefill of prompt + answer alone: greedy decoding alone picks, at every position, the argmax of the
logits after the tokens before it, so an answer is what the model says alone exactly when each of its tokens is that
argmax (a near-tie forgiven as ever) and it stops where decoding alone would (end of sequence or ``max_tokens``).
The returned ``SoloRun`` is what decoding alone would have made, up to the first token where the answer parts from
it, so ``compare_to_solo`` reads it as it reads a solo run.
"""

from __future__ import annotations

import functools

import torch

from labkit.engine.reference import SoloRun


def teacher_forced(model, prompt_ids: list[int], answer: list[int], max_tokens: int) -> SoloRun:
    """The model's own greedy choices alone after ``prompt_ids + answer[:i]``, for every i; once per process."""
    return _teacher_forced(model, tuple(prompt_ids), tuple(answer), max_tokens)


@functools.lru_cache(maxsize=16)  # the same answer from another policy or k is checked once (ten chats here)
def _teacher_forced(model, prompt_ids: tuple[int, ...], answer: tuple[int, ...], max_tokens: int) -> SoloRun:
    eos = set(model.config.eos_token_ids)
    logits, _ = model.prefill(list(prompt_ids + answer))
    chosen_from = logits[len(prompt_ids) - 1 :].clone()  # each answer token's logits, then the next one's; kept small
    run = SoloRun([], [], [])
    for last in chosen_from:
        top2 = torch.topk(last, 2).values
        run.tokens.append(int(last.argmax()))
        run.logits.append(last)
        run.gaps.append(float(top2[0] - top2[1]))
        if run.tokens[-1] in eos or len(run.tokens) == max_tokens:
            break  # where decoding alone stops; an answer that stopped sooner is one token short of it
    return run
