"""A second, slower tier for prefix blocks the pool evicts: host memory outside the pool, or files on disk.

An evicted block's K/V (every layer's) are copied out to the tier under the block's hash instead of being lost,
and a later prompt whose hash chain runs on past what the pool still holds copies them back into fresh blocks
instead of computing their tokens again (vLLM's offloading connector, LMCache and SGLang's hierarchical cache
do this between GPU and host memory; our own code). The tier is bounded (the least recently used block goes),
trusts a block by its hash, as vLLM's offloading does, and keeps the pool's own bytes (fp8 ones too), so a
reloaded block is bitwise the one evicted.

The allocator (:mod:`labkit.kv.prefix_cache`) decides which blocks move, the model runner moves them
(:func:`move_blocks`) before each forward pass, and :func:`labkit.kv.tier_policy.reload_or_recompute` decides
whether a run found here is worth reloading.
"""

from __future__ import annotations

import numbers
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import torch

from labkit.kv.fp8 import as_bytes
from labkit.kv.paged_cache import PagedKVCache
from labkit.kv.tier_policy import BACKENDS, capacity_in_blocks


class KVTier:
    """The bookkeeping every tier shares: which hashes it holds, in LRU order, and its counters.

    Counters: ``spilled`` (blocks copied in), ``reloaded`` (blocks copied back out: the hits),
    ``misses`` (lookups that found the next block absent), ``dropped`` (blocks pushed out by the bound),
    ``queried`` (blocks looked for past the pool's run). Subclasses store the data (:meth:`_store`,
    :meth:`_load`, :meth:`_discard`).
    """

    backend = "none"

    def __init__(self, capacity_blocks: int):
        if (
            isinstance(capacity_blocks, bool)
            or not isinstance(capacity_blocks, numbers.Integral)
            or capacity_blocks < 1
        ):
            raise ValueError(f"a KV tier holds at least 1 block, got capacity_blocks={capacity_blocks!r}")
        self.capacity_blocks: int = int(capacity_blocks)
        self._order: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.spilled: int = 0
        self.reloaded: int = 0
        self.misses: int = 0
        self.dropped: int = 0
        self.queried: int = 0

    def __len__(self) -> int:
        return len(self._order)

    def holds(self, key: int) -> bool:
        """Whether the tier has the block named ``key`` (changes nothing)."""
        return key in self._order

    def held_run(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes``, from the first, the tier holds in a row; counted as a lookup."""
        run = 0
        while run < len(hashes) and hashes[run] in self._order:
            run += 1
        self.queried += len(hashes)
        self.misses += run < len(hashes)
        return run

    def put(self, key: int, data: torch.Tensor) -> None:
        """Keep ``data`` (one block's K/V, all layers) under ``key``; the least recently used goes if full."""
        if key in self._order:  # the same hash is the same content: only its place in the LRU order changes
            self._order.move_to_end(key)
            return
        while len(self._order) >= self.capacity_blocks:
            oldest, _ = self._order.popitem(last=False)
            self._discard(oldest)
            self.dropped += 1
        self._store(key, data)
        self._order[key] = None
        self.spilled += 1

    def get(self, key: int) -> torch.Tensor:
        """The data kept under ``key`` (it stays, now the most recently used)."""
        if key not in self._order:
            raise KeyError(f"the KV tier holds no block {key}; ask holds() first")
        self._order.move_to_end(key)
        self.reloaded += 1
        return self._load(key)

    def stats(self) -> dict[str, int | str]:
        """The counters and the occupancy, as plain values (for describe() and /metrics)."""
        return dict(
            backend=self.backend,
            capacity_blocks=self.capacity_blocks,
            held_blocks=len(self),
            spilled=self.spilled,
            reloaded=self.reloaded,
            misses=self.misses,
            dropped=self.dropped,
            queried=self.queried,
        )

    def _store(self, key: int, data: torch.Tensor) -> None:
        raise NotImplementedError

    def _load(self, key: int) -> torch.Tensor:
        raise NotImplementedError

    def _discard(self, key: int) -> None:
        raise NotImplementedError


class HostTier(KVTier):
    """Blocks in host memory, outside the pool (vLLM's "native" CPU offloading)."""

    backend = "native"

    def __init__(self, capacity_blocks: int):
        super().__init__(capacity_blocks)
        self._data: dict[int, torch.Tensor] = {}

    def _store(self, key: int, data: torch.Tensor) -> None:
        self._data[key] = data.to("cpu", copy=True)

    def _load(self, key: int) -> torch.Tensor:
        return self._data[key]

    def _discard(self, key: int) -> None:
        del self._data[key]


class DiskTier(KVTier):
    """Blocks as files under ``directory``, one per block (a fresh temporary directory, removed with the tier,
    when none is given)."""

    backend = "disk"

    def __init__(self, capacity_blocks: int, directory: str | Path | None = None):
        super().__init__(capacity_blocks)
        self._temporary = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="labkit-kv-tier-") if directory is None else directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, key: int) -> Path:
        return self.directory / f"{key & 0xFFFFFFFFFFFFFFFF:016x}.pt"  # a hash may be negative

    def _store(self, key: int, data: torch.Tensor) -> None:
        torch.save(data.to("cpu"), self._path(key))

    def _load(self, key: int) -> torch.Tensor:
        return torch.load(self._path(key), weights_only=True)

    def _discard(self, key: int) -> None:
        self._path(key).unlink(missing_ok=True)

    def __del__(self) -> None:
        if getattr(self, "_temporary", False):
            shutil.rmtree(self.directory, ignore_errors=True)


def block_bytes(cache: PagedKVCache) -> int:
    """Bytes one block takes in the pool, K and V of every layer (what the tier keeps per block)."""
    return cache.nbytes() // cache.num_blocks


def make_tier(backend: str, size_gib: float, cache: PagedKVCache, directory: str | Path | None = None) -> KVTier:
    """The tier ``kv_offloading_backend`` and ``kv_offloading_size`` describe, for blocks of ``cache``."""
    capacity = capacity_in_blocks(size_gib, block_bytes(cache))
    if backend == "native":
        return HostTier(capacity)
    if backend == "disk":
        return DiskTier(capacity, directory)
    raise ValueError(f"kv_offloading_backend must be one of {BACKENDS}, got {backend!r}")


def read_block(cache: PagedKVCache, block: int) -> torch.Tensor:
    """One pool block's K and V of every layer, as stored (fp8 as bytes): [layers, 2, block_size, heads, dim]."""
    return torch.stack(
        [
            torch.stack([as_bytes(cache.k[layer][block]), as_bytes(cache.v[layer][block])])
            for layer in range(len(cache.k))
        ]
    )


def write_block(cache: PagedKVCache, block: int, data: torch.Tensor) -> None:
    """Put ``data`` (as :func:`read_block` gives it) into pool block ``block``."""
    expected = read_block(cache, block).shape
    if data.shape != expected:
        raise ValueError(f"a tier block shaped {tuple(data.shape)} does not fit this pool's blocks {tuple(expected)}")
    data = data.to(cache.k[0].device)
    for layer in range(len(cache.k)):
        as_bytes(cache.k[layer])[block].copy_(data[layer, 0])
        as_bytes(cache.v[layer])[block].copy_(data[layer, 1])


def move_blocks(
    cache: PagedKVCache, tier: KVTier, spills: Sequence[tuple[int, int]], reloads: Sequence[tuple[int, int]]
) -> None:
    """Carry out a step's pending moves, each ``(hash, block)``, before its forward pass overwrites anything.

    The reloads are read out of the tier first (the spills could push them out), the spills copied out of
    the pool next (a reload may land in a block just evicted), and the reloads written last.
    """
    loaded = [(block, tier.get(key)) for key, block in reloads]
    for key, block in spills:
        tier.put(key, read_block(cache, block))
    for block, data in loaded:
        write_block(cache, block, data)
