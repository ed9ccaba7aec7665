"""What ``labkit route`` knows of a request: its prompt's text, and (where it has the fleet's tokenizer) its tokens.

The routing policies themselves are the engine's (:data:`labkit.engine.fleet.ROUTERS`, one registry by name:
``round_robin``, ``least_loaded``, ``cache_aware``), the same objects the engines' and the simulator's fleets run:
one router, both clocks. Over HTTP each sees a :class:`~labkit.engine.interfaces.RequestView` holding the prompt's
text (:func:`prompt_text`) and, where the router tokenizes (``cache_aware``: it needs the tokens to know what is
cached), its token ids (:func:`prompt_ids`, as the replica makes them), and one
:class:`~labkit.engine.interfaces.ReplicaView` per replica in service, where "unfinished" is the requests in flight
at the router and "cached_tokens" comes from :mod:`~labkit.serve.router_caches`, in tokens.
"""

from __future__ import annotations

import json
from typing import Any

from labkit.engine.fleet import DEFAULT_MAX_IMBALANCE, ROUTERS
from labkit.serve.protocol import APIError, parse_request

POLICIES = tuple(ROUTERS)  # ``--policy``'s choices
__all__ = ["DEFAULT_MAX_IMBALANCE", "POLICIES", "prompt_ids", "prompt_text"]


def prompt_text(body: object) -> str:
    """The request's prompt as text, before any tokenizing (``RequestView.prompt_text``): a completion's prompt
    (token ids written as numbers), or a chat's messages, each as ``<role>content`` in order."""
    if not isinstance(body, dict):
        return ""
    if "messages" in body:
        messages = body["messages"] if isinstance(body["messages"], list) else []
        parts = []
        for message in messages:
            if isinstance(message, dict):
                content = message.get("content")
                text = content if isinstance(content, str) else json.dumps(content)
                parts.append(f"<{message.get('role')}>{text}\n")
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[0]  # a batch of prompts: the first one decides
    if isinstance(prompt, list):
        return " ".join(str(token) for token in prompt) + " "
    return ""


def prompt_ids(body: object, kind: str, tokenizer: Any) -> list[int] | None:
    """The prompt's token ids as a replica of the fleet's model makes them: the body read as ``labkit serve`` reads
    it (``kind``: ``"chat"`` or ``"completion"``), chat messages through the model's chat template. None for a
    body the replica will refuse: it says why, and nothing is cached for it."""
    from labkit.models.tokens import encode_prompt  # here: importing labkit.models brings torch

    try:
        return encode_prompt(tokenizer, parse_request(body, kind).prompt)
    except (APIError, ValueError, TypeError):
        return None
