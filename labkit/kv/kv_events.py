"""What a prefix cache tells the world: the blocks it stored, removed and cleared, each named by its hash.

vLLM publishes such events when ``kv_events_config`` is set (``vllm/distributed/kv_events.py``), so a router can
know what each replica holds instead of remembering what it sent there (llm-d's precise prefix-cache routing).
The names are the prefix cache's own block hashes (:func:`~labkit.kv.prefix_cache.block_hashes`), so a router
that tokenizes a prompt alike finds, block by block, what the replica would find (Python's ``hash`` of a tuple
of ints is the same in every process of one Python version; only str and bytes hashes are salted). vLLM's
``BlockStored`` also carries the token ids; labkit's leaves them out: a router needs only the names, and a
prompt's tokens are not for whoever can reach the endpoint.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import deque
from dataclasses import asdict, dataclass

DEFAULT_MAX_EVENTS = 16384  # events kept for readers that poll; one behind by more gets the held hashes instead


@dataclass(frozen=True)
class BlockStored:
    """Full blocks named in the prefix cache, in chain order: each hash names the block and every token before it."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None  # the hash of the block before the first one (None: the chain's start)
    block_size: int


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks evicted: their content leaves the cache (the block holds other tokens from now on)."""

    block_hashes: tuple[int, ...]


@dataclass(frozen=True)
class AllBlocksCleared:
    """The whole prefix cache was reset: nothing it named is findable any more."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


def event_json(event: KVEvent) -> dict:
    """An event as JSON (vLLM's field names, and its class name as ``type``)."""
    return {"type": type(event).__name__, **asdict(event)}


def apply_event(held: dict[int, None], event: KVEvent | dict) -> None:
    """Bring ``held`` (the hashes a cache holds) up to date with one event, as a dataclass or as its JSON."""
    kind = event["type"] if isinstance(event, dict) else type(event).__name__
    hashes = event.get("block_hashes", ()) if isinstance(event, dict) else getattr(event, "block_hashes", ())
    if kind == "BlockStored":
        held.update(dict.fromkeys(hashes))
    elif kind == "BlockRemoved":
        for key in hashes:
            held.pop(key, None)
    elif kind == "AllBlocksCleared":
        held.clear()
    else:
        raise ValueError(f"unknown KV event type {kind!r}: BlockStored, BlockRemoved or AllBlocksCleared")


class KVEventLog:
    """A prefix cache's events, numbered from 0 in order of publication, the recent ones kept for polling readers
    (``labkit serve``'s ``GET /kv_events``). Thread-safe: the engine's thread publishes, the server's loop reads."""

    def __init__(self, block_size: int, max_events: int = DEFAULT_MAX_EVENTS):
        if max_events < 1:
            raise ValueError(f"max_events must be 1 or more, got {max_events}")
        self.block_size = block_size
        self.epoch = uuid.uuid4().hex  # this log's name: a reader's number means nothing in another run's log
        self._lock = threading.Lock()
        self._events: deque[KVEvent] = deque(maxlen=max_events)
        self._next = 0  # the number the next event gets
        self._held: dict[int, None] = {}  # the hashes the cache holds after every event so far

    def publish(self, event: KVEvent) -> None:
        """Number and keep one event (the prefix cache calls this as it changes)."""
        with self._lock:
            self._events.append(event)
            self._next += 1
            apply_event(self._held, event)

    def read(self, since: int, epoch: str | None = None, limit: int = 4096) -> dict:
        """What a reader that has applied every event before number ``since`` of log ``epoch`` reads next.

        Either ``events`` (at most ``limit``, in order; ``next`` is the number to ask from then, ``more`` whether
        others follow), or, for a reader of another log or one behind the kept window, ``held``: every hash the
        cache holds now, which replaces what the reader had (``next`` follows it).
        """
        with self._lock:
            oldest = self._next - len(self._events)
            reply: dict = {"epoch": self.epoch, "block_size": self.block_size}
            if epoch != self.epoch or not oldest <= since <= self._next:
                return {**reply, "next": self._next, "held": list(self._held)}
            start = since - oldest
            taken = [event_json(event) for event in itertools.islice(self._events, start, start + limit)]
            following = since + len(taken)
            return {**reply, "next": following, "more": following < self._next, "events": taken}
