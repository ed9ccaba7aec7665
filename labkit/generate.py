"""Generating for one conversation: prefill once, then decode token by token, streaming as we go."""

from __future__ import annotations

from typing import Iterator

from labkit.models.llama import LlamaModel
from labkit.models.tokens import Prompt, encode_prompt
from labkit.sampling import SamplingParams, make_generator, sample


def stream_tokens(model: LlamaModel, prompt: Prompt, params: SamplingParams = SamplingParams()) -> Iterator[int]:
    """Yield each new token id as soon as it is chosen; stop on EOS, a stop id or max_tokens."""
    ids = encode_prompt(model.tokenizer, prompt)
    if len(ids) + params.max_tokens > model.config.max_position_embeddings:
        raise ValueError(
            f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
            f"model's context of {model.config.max_position_embeddings}; shorten one"
        )
    generator = make_generator(params, model.device)
    stop = set(params.stop_token_ids) | (set() if params.ignore_eos else set(model.config.eos_token_ids))
    logits, cache = model.prefill(ids)
    last = logits[-1]
    for _ in range(params.max_tokens):
        token = int(sample(last[None], [params], [generator])[0])
        yield token
        if token in stop:
            return
        last = model.decode(token, cache)


def generate(model: LlamaModel, prompt: Prompt, params: SamplingParams = SamplingParams()) -> list[int]:
    """All new token ids at once (see stream_tokens)."""
    return list(stream_tokens(model, prompt, params))


def chat(
    model: LlamaModel, messages: list[dict] | str, params: SamplingParams = SamplingParams(), stream: bool = False
) -> str | Iterator[str]:
    """Reply to chat messages with text, either whole or as a stream of text pieces."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    tokens = stream_tokens(model, messages, params)
    if stream:
        return _text_pieces(model, tokens)
    return model.tokenizer.decode(list(tokens), skip_special_tokens=True)


def _text_pieces(model: LlamaModel, tokens: Iterator[int]) -> Iterator[str]:
    """Decode incrementally so multi-token characters come out whole."""
    seen: list[int] = []
    printed = ""
    for token in tokens:
        seen.append(token)
        text = model.tokenizer.decode(seen, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            continue  # half of a multi-byte character: wait for the rest
        yield text[len(printed) :]
        printed = text
