"""Turning what a user sends (text, chat messages or token ids) into token ids, one way everywhere."""

from __future__ import annotations

Prompt = str | list[dict] | list[int]


def encode_prompt(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids for a prompt; chat messages go through the model's own chat template."""
    if isinstance(prompt, str):
        _require(tokenizer, "a text prompt")
        return list(tokenizer.encode(prompt))
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        _require(tokenizer, "chat messages")
        for message in prompt:
            if "role" not in message or "content" not in message:
                raise ValueError(f"each chat message needs 'role' and 'content'; got {message!r}")
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        return list(tokenizer.encode(text, add_special_tokens=False))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    raise ValueError(
        "a prompt must be a non-empty string, a list of chat messages "
        "({'role': ..., 'content': ...}) or a list of token ids"
    )


def _require(tokenizer, what: str) -> None:
    if tokenizer is None:
        raise ValueError(f"this model has no tokenizer, so it cannot take {what}; pass token ids")
