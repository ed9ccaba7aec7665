"""Multi-turn ShareGPT replay: every turn of a conversation resends the whole history, as a chat app does.

A chat model keeps no state between calls, so turn k of a conversation is sent as the
system template, turns 1 .. k-1 (the user's messages and the recorded replies) and the
k-th user message. Turn k's prompt therefore starts with turn k-1's prompt: the prefix
cache should find it. This module turns ShareGPT conversations into such requests, each
turn arriving ``think_time_s`` after the previous one (an open loop: it does not wait for
the answer), conversations starting ``conversation_gap_s`` apart.

The history holds the *recorded* replies, not the ones the engine generates, so the cache
finds each turn's previous prompt but not the reply after it (a replay with the engine's own
replies would find both). A prompt longer than ``max_prompt_tokens`` ends its conversation:
cutting it would break the shared prefix. Prompts are chat messages; pass a tokenizer for
exact lengths (without one, lengths are estimates and the engine still counts real tokens).
A ``system_prompt`` leads every turn of every conversation, as a chat app's instructions do: the
one prefix all of them share. :func:`as_token_ids` turns the prompts into token ids for the
simulator, which compares ids and nothing else.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from labkit.workloads.sharegpt import load_sharegpt
from labkit.workloads.spec import RequestSpec, Workload
from labkit.workloads.tokens import count_tokens, estimate_tokens, stand_in_token_ids

ROLES = {"human": "user", "gpt": "assistant"}
TEMPLATE_TOKENS_PER_TURN = 4  # the estimate's allowance for a chat turn's header, without a tokenizer


def exchanges(conversation: dict) -> list[tuple[str, str]]:
    """The (user message, recorded reply) pairs of a conversation, in order, up to the first that breaks the
    alternation or is empty."""
    turns = conversation.get("conversations") or []
    pairs = []
    for question, answer in zip(turns[0::2], turns[1::2]):
        if question.get("from") != "human" or answer.get("from") != "gpt":
            break
        if not question.get("value") or not answer.get("value"):
            break
        pairs.append((question["value"], answer["value"]))
    return pairs


def turn_messages(pairs: list[tuple[str, str]], turn: int, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The chat messages sent for ``turn`` (0-based): the system prompt if any, every earlier exchange, then this
    turn's user message."""
    messages = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
    for question, answer in pairs[:turn]:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return messages + [{"role": "user", "content": pairs[turn][0]}]


def _length(messages: list[dict[str, str]], tokenizer) -> int:
    if tokenizer is None:
        return sum(estimate_tokens(m["content"]) + TEMPLATE_TOKENS_PER_TURN for m in messages)
    from labkit.models.tokens import encode_prompt  # here, so lengths-only users never import torch

    return len(encode_prompt(tokenizer, messages))


def _check_shape(
    num_conversations: int, min_turns: int, max_turns: int, think_time_s: float, conversation_gap_s: float
) -> None:
    """Refuse no conversations, an empty or inverted range of turns, and negative pauses."""
    if num_conversations < 1:
        raise ValueError(f"num_conversations must be >= 1, got {num_conversations!r}")
    if not 1 <= min_turns <= max_turns:
        raise ValueError(f"need 1 <= min_turns <= max_turns, got {min_turns} and {max_turns}")
    if think_time_s < 0 or conversation_gap_s < 0:
        raise ValueError("think_time_s and conversation_gap_s must be >= 0 seconds")


def _turns(
    pairs: list[tuple[str, str]],
    name: str,
    start: float,
    think_time_s: float,
    tokenizer,
    system_prompt: str | None,
    max_tokens: tuple[int | None, int | None],
) -> list[RequestSpec]:
    """One conversation's requests, a turn each from ``start``, up to the first prompt over its limit;
    ``max_tokens`` caps (prompt, answer) tokens."""
    max_prompt_tokens, max_output_tokens = max_tokens
    turns = []
    for turn in range(len(pairs)):
        messages = turn_messages(pairs, turn, system_prompt)
        prompt_len = _length(messages, tokenizer)
        if max_prompt_tokens is not None and prompt_len > max_prompt_tokens:
            break
        output_len = max(1, count_tokens(pairs[turn][1], tokenizer))
        if max_output_tokens is not None:
            output_len = min(output_len, max_output_tokens)
        turns.append(
            RequestSpec(f"{name}-turn{turn + 1}", start + turn * think_time_s, prompt_len, output_len, messages)
        )
    return turns


def sharegpt_multiturn(
    num_conversations: int,
    seed: int = 0,
    tokenizer=None,
    *,
    min_turns: int = 2,
    max_turns: int = 4,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
    think_time_s: float = 5.0,
    conversation_gap_s: float = 1.0,
    limit: int | None = None,
    system_prompt: str | None = None,
) -> Workload:
    """``num_conversations`` seeded ShareGPT conversations of ``min_turns`` to ``max_turns`` turns, one request
    per turn, each resending the history; in order of arrival.

    A turn's answer length is its recorded reply's (clipped to ``max_output_tokens``). Conversations with
    fewer than ``min_turns`` usable turns (within ``max_prompt_tokens``) are skipped.
    """
    _check_shape(num_conversations, min_turns, max_turns, think_time_s, conversation_gap_s)
    data = load_sharegpt(limit)
    requests: list[RequestSpec] = []
    chosen = 0
    for index in np.random.default_rng(seed).permutation(len(data.conversations)).tolist():
        conversation = data.conversations[index]
        turns = _turns(
            exchanges(conversation)[:max_turns],
            f"sharegpt-{conversation.get('id', index)}",
            chosen * conversation_gap_s,
            think_time_s,
            tokenizer,
            system_prompt,
            (max_prompt_tokens, max_output_tokens),
        )
        if len(turns) < min_turns:
            continue
        requests += turns
        chosen += 1
        if chosen == num_conversations:
            break
    else:
        raise ValueError(
            f"only {chosen} conversations with at least {min_turns} usable turns among the "
            f"{len(data.conversations):,} read; ask for fewer, lower min_turns or raise limit"
        )
    requests.sort(key=lambda r: r.arrival_time)
    meta = {
        "seed": seed,
        "source": str(data.path),
        "turns": (min_turns, max_turns),
        "think_time_s": think_time_s,
        "conversation_gap_s": conversation_gap_s,
        "max_prompt_tokens": max_prompt_tokens,
        "max_output_tokens": max_output_tokens,
        "lengths": "tokens" if tokenizer else "estimated",
        "system_prompt": system_prompt,
    }
    return Workload(tuple(requests), name="sharegpt-multiturn", meta=meta)


def _chat_token_ids(messages: list[dict[str, str]]) -> list[int]:
    ids = []
    for message in messages:  # a header per message, as a chat template writes one
        ids += stand_in_token_ids(f"<|{message['role']}|>") + stand_in_token_ids(message["content"])
    return ids


def as_token_ids(workload: Workload, tokenizer=None) -> Workload:
    """The same turns with their chat messages as token ids, for the simulator: with a tokenizer the engine's own
    (its chat template), without one stand-ins (:func:`~labkit.workloads.tokens.stand_in_token_ids`) with the
    property that matters here: a turn's ids start with the previous turn's, and the system prompt's ids are
    every conversation's. Prompt lengths become the ids' counts."""
    if tokenizer is not None:
        from labkit.models.tokens import encode_prompt  # here, so the simulator's users never import torch

    requests = []
    for spec in workload:
        if not isinstance(spec.prompt, list) or not spec.prompt or not isinstance(spec.prompt[0], dict):
            raise ValueError(f"request {spec.request_id!r} has no chat messages to turn into token ids")
        ids = encode_prompt(tokenizer, spec.prompt) if tokenizer is not None else _chat_token_ids(spec.prompt)
        requests.append(replace(spec, prompt=ids, prompt_len=len(ids)))
    return replace(workload, requests=tuple(requests), meta={**workload.meta, "prompts": "token ids"})
