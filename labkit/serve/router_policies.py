"""What ``labkit route`` knows of a request before tokenizing: its prompt's text, and a shadow index of the caches.

The routing policies themselves are the engine's (:data:`labkit.engine.fleet.ROUTERS`, one registry by name:
``round_robin``, ``least_loaded``, ``cache_aware``), the same objects the engines' and the simulator's fleets run:
one router, both clocks. Over HTTP each sees a :class:`~labkit.engine.interfaces.RequestView` holding the prompt's
text (:func:`prompt_text`; no token ids, since the router does not tokenize) and one
:class:`~labkit.engine.interfaces.ReplicaView` per replica in service, where "unfinished" is the requests in flight
at the router and "cached" comes from the router's :class:`ShadowIndex`, in characters.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence

from labkit.engine.fleet import DEFAULT_MAX_IMBALANCE, ROUTERS
from labkit.kv.prefix_cache import block_hashes

DEFAULT_CHUNK_CHARS = 64  # characters per shadow block: about 16 tokens of English, the engine's block size
DEFAULT_INDEX_BLOCKS = 65536  # shadow blocks remembered per replica (~4 M characters of prompts)
POLICIES = tuple(ROUTERS)  # ``--policy``'s choices
__all__ = ["DEFAULT_MAX_IMBALANCE", "POLICIES", "ShadowIndex", "prompt_text"]


def prompt_text(body: object) -> str:
    """The text a request's prompt starts with, as the router sees it (no tokenizer): a completion's prompt
    (token ids written as numbers), or a chat's messages, each as ``<role>content`` in order, so the next turn
    of a conversation (its history, the answer, a new message) extends the text of the turn before."""
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


class ShadowIndex:
    """What the router believes each replica has cached: the block-hash chain of the prompts it sent there.

    The router does not tokenize (it stays light, and needs no model): a prompt's text is cut into blocks of
    ``chunk_chars`` characters and chained with the prefix cache's own :func:`~labkit.kv.prefix_cache.block_hashes`
    (one hash names a block and everything before it), over the characters' code points. Each replica keeps
    its ``max_blocks`` most recently sent hashes (LRU), a chain's end evicted before its start (as vLLM frees a
    request's blocks last first), so a prefix stays findable as long as any of it is. It is a prediction:
    a replica may have evicted what the router still remembers (vLLM's KV events would correct that; here the
    LRU bound only keeps the belief from growing without end). ``cached`` counts characters, not tokens.
    """

    def __init__(
        self, num_replicas: int, chunk_chars: int = DEFAULT_CHUNK_CHARS, max_blocks: int = DEFAULT_INDEX_BLOCKS
    ):
        if chunk_chars < 1 or max_blocks < 1:
            raise ValueError(f"chunk_chars and max_blocks must be 1 or more, got {chunk_chars} and {max_blocks}")
        self.chunk_chars = chunk_chars
        self.max_blocks = max_blocks
        self.blocks: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_replicas)]

    def chain(self, text: str) -> list[int]:
        """The hash chain of the text's full blocks (a last partial block gets none)."""
        return block_hashes([ord(char) for char in text], self.chunk_chars)

    def cached(self, replica: int, chain: Sequence[int]) -> int:
        """Characters of the prompt (its ``chain``) the replica is believed to hold: the longest run from the start."""
        held = self.blocks[replica]
        run = 0
        for key in chain:
            if key not in held:
                break
            run += 1
        return run * self.chunk_chars

    def record(self, replica: int, chain: Sequence[int]) -> None:
        """The replica was sent this prompt: its blocks are now (believed) cached there, most recently used."""
        held = self.blocks[replica]
        for key in reversed(chain):  # the first block last, so most recent: the tail of a chain is evicted first
            held[key] = None
            held.move_to_end(key)
        while len(held) > self.max_blocks:
            held.popitem(last=False)
