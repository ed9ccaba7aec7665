"""What ``labkit route`` knows of each replica's prefix cache, in tokens: the replica's own KV events, else a guess.

The router tokenizes each prompt once, with the fleet's tokenizer and chat template (the replicas serve one model),
and names its full blocks with the prefix cache's own :func:`~labkit.kv.prefix_cache.block_hashes`. How many
tokens a replica holds is then the longest run of those names the replica holds, counted as its scheduler counts
(never the prompt's last token, whose logits it must compute), so ``cached_tokens`` means tokens as it does in
the engines' fleets. Where the names held come from:

- **KV events** (:class:`EventFeed`): a replica that publishes its prefix cache's events (``labkit serve``'s
  ``GET /kv_events``; vLLM publishes the same over ZeroMQ) is read just before each routing decision, from the
  event number the router got to. Polling over HTTP, not a stream: the router already speaks HTTP to its
  replicas, a poll needs no connection kept open nor a new dependency (vLLM uses ZeroMQ), survives a replica's
  restart (its log has a new epoch, and the reply is then the hashes it holds), and read right before the
  decision it is never stale for a replica with nothing in flight, so with one request at a time the
  prediction is exact. With requests in flight, a replica may change its cache between the poll and the
  moment it admits the request. The events tell the KV pool only: blocks a replica would reload from its slower
  tier (:mod:`labkit.kv.tier`) are not predicted.
- **The shadow index** (:class:`ShadowIndex`), for a replica that publishes none (or with ``--no-kv-events``):
  the blocks of the prompts the router sent there, as SGLang's router and llm-d's approximate mode keep them.
  A belief: it never sees an eviction.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Container, Sequence

import httpx

from labkit.kv.kv_events import apply_event
from labkit.kv.prefix_cache import block_hashes

DEFAULT_BLOCK_SIZE = 16  # the shadow index's block, in tokens: labkit serve's and vLLM's default
DEFAULT_INDEX_BLOCKS = 65536  # shadow blocks remembered per replica (~1 M tokens of prompts)
EVENTS_TIMEOUT_S = 2.0  # a replica slower than this to say what it holds is routed on what the router knew
RECHECK_S = 30.0  # a replica that publishes no events is asked again after this long (it may have restarted)
KV_EVENTS, SHADOW = "kv_events", "shadow"  # where a replica's cached_tokens came from


def cached_run(held: Container[int], token_ids: Sequence[int], block_size: int) -> int:
    """Tokens of the prompt ``token_ids`` a cache holding the block hashes ``held`` would give it: the longest run
    of its full blocks from the start, leaving at least the last token to compute (as the scheduler does)."""
    run = 0
    for key in block_hashes(token_ids[:-1], block_size):
        if key not in held:
            break
        run += 1
    return run * block_size


class ShadowIndex:
    """What the router believes each replica has cached: the block hashes of the prompts it sent there.

    Each replica keeps its ``max_blocks`` most recently sent hashes (LRU), a chain's end evicted before its start
    (as the engine frees a request's blocks last first), so a prefix stays findable as long as any of it is. It
    is a prediction: a replica may have evicted what the router still remembers (its KV events say so); the LRU
    bound only keeps the belief from growing without end.
    """

    def __init__(self, num_replicas: int, block_size: int = DEFAULT_BLOCK_SIZE, max_blocks: int = DEFAULT_INDEX_BLOCKS):
        if block_size < 1 or max_blocks < 1:
            raise ValueError(f"block_size and max_blocks must be 1 or more, got {block_size} and {max_blocks}")
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.blocks: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_replicas)]

    def cached(self, replica: int, token_ids: Sequence[int]) -> int:
        """Tokens of the prompt the replica is believed to hold."""
        return cached_run(self.blocks[replica], token_ids, self.block_size)

    def record(self, replica: int, token_ids: Sequence[int]) -> None:
        """The replica was sent this prompt: its full blocks are now (believed) cached there, most recently used."""
        held = self.blocks[replica]
        for key in reversed(block_hashes(token_ids, self.block_size)):  # the first block last: most recent
            held[key] = None
            held.move_to_end(key)
        while len(held) > self.max_blocks:
            held.popitem(last=False)


class EventFeed:
    """One replica's prefix cache as its KV events tell it: the hashes it holds, and where the router got to."""

    def __init__(self, url: str):
        self.url = url
        self.held: dict[int, None] = {}
        self.block_size = DEFAULT_BLOCK_SIZE
        self.epoch: str | None = None  # the replica's event log this feed follows; None: none read yet
        self.next = 0  # the number of the next event to read
        self.publishes: bool | None = None  # None: not known yet
        self.asked_at = -RECHECK_S  # time.monotonic() of the last "no events here"
        self.read_from = -1.0  # time.monotonic() when the last complete read began
        self.lock = asyncio.Lock()  # one read at a time: a request that waited for one begun after it asked reads none

    @property
    def known(self) -> bool:
        return bool(self.publishes) and self.epoch is not None

    async def refresh(self, client: httpx.AsyncClient) -> None:
        """Read every event the replica has published since the last read (or what it holds, if the log is new)."""
        asked = time.monotonic()
        if self.publishes is False and asked - self.asked_at < RECHECK_S:
            return
        async with self.lock:
            if self.read_from >= asked:  # a read that began after this request asked has just ended
                return
            began, more = time.monotonic(), True
            while more:
                params = {"since": str(self.next), **({"epoch": self.epoch} if self.epoch else {})}
                try:
                    answer = await client.get(self.url + "/kv_events", params=params, timeout=EVENTS_TIMEOUT_S)
                except httpx.TransportError:  # down: the health checks see to it
                    return
                if answer.status_code != 200:  # 404: it publishes none (the shadow index guesses for it)
                    if answer.status_code == 404:
                        self.publishes, self.asked_at = False, time.monotonic()
                    return
                try:
                    reply = answer.json()
                    self.apply(reply)
                except (ValueError, KeyError, TypeError, AttributeError):  # not labkit's events: none to read
                    self.publishes, self.asked_at = False, time.monotonic()
                    return
                more = bool(reply.get("more"))
            self.read_from = began

    def apply(self, reply: dict) -> None:
        """Bring the feed up to date with one reply of ``GET /kv_events``."""
        self.publishes, self.epoch, self.block_size = True, reply["epoch"], int(reply["block_size"])
        if "held" in reply:
            self.held = dict.fromkeys(reply["held"])
        for event in reply.get("events", []):
            apply_event(self.held, event)
        self.next = int(reply["next"])


class FleetCaches:
    """What the router knows of every replica's prefix cache: its KV events where it publishes them (and
    ``use_events``), else the shadow index, which records every prompt routed either way."""

    def __init__(self, urls: Sequence[str], shadow: ShadowIndex, use_events: bool = True):
        self.shadow = shadow
        self.feeds = [EventFeed(url) for url in urls] if use_events else None

    async def refresh(self, client: httpx.AsyncClient, replicas: Sequence[int]) -> None:
        """Read the replicas' new events (those that publish them), all at once."""
        if self.feeds is not None:
            feeds = self.feeds
            await asyncio.gather(*(feeds[replica].refresh(client) for replica in replicas))

    def source(self, replica: int) -> str:
        """Where the replica's cached tokens come from: ``kv_events`` or ``shadow``."""
        return KV_EVENTS if self.feeds is not None and self.feeds[replica].known else SHADOW

    def cached(self, replica: int, token_ids: Sequence[int]) -> int:
        """Tokens of the prompt ``token_ids`` the replica holds (by its events) or is believed to hold."""
        if self.feeds is not None and self.feeds[replica].known:
            feed = self.feeds[replica]
            return cached_run(feed.held, token_ids, feed.block_size)
        return self.shadow.cached(replica, token_ids)

    def record(self, replica: int, token_ids: Sequence[int]) -> None:
        """The replica answered this prompt: the shadow index remembers it there."""
        self.shadow.record(replica, token_ids)
