"""A block allocator that remembers what its full blocks hold, so a new request can skip a prefix it shares.

Chat requests repeat themselves: the same system prompt, the same history. Each *full*
block is named by a hash of (its parent block's hash, its token ids), so one hash stands for
the whole prefix up to that block, and the same tokens at another position (another parent)
get another name. A map from hash to block finds the longest run of blocks a new request
can take instead of computing (vLLM V1's automatic prefix caching; our own code). The last,
partial block of a sequence is never named: it is still being written.

A block several sequences share is freed when the last one lets go (reference counts). A
freed block that has a hash keeps it and waits on an LRU list of *evictable* blocks: it is
free to reuse, yet still findable. Allocation takes blocks that hold nothing reusable first,
then evicts the least recently freed cached block, which leaves the map.

Plain Python, no tensors: the real engine and the simulator both use it. Two optional parts are off by
default: a slower tier for evicted blocks (:meth:`~PrefixCachingBlockAllocator.attach_tier`,
:mod:`labkit.kv.tier`) and vLLM's KV events (:meth:`~PrefixCachingBlockAllocator.publish_events`,
:mod:`labkit.kv.kv_events`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from labkit.kv.block_allocator import FreeListBlockAllocator, OutOfBlocksError
from labkit.kv.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from labkit.kv.tier_policy import reload_or_recompute

# reload_policy(prompt_tokens, cached_tokens, tier_blocks, block_size) -> positions of the blocks to reload
ReloadPolicy = Callable[[int, int, int, int], Sequence[int]]

NO_PARENT = 0  # the hash chain's start: the first block's parent


def block_hash(parent: int, token_ids: Sequence[int]) -> int:
    """The name of a full block: its tokens and, through the parent's hash, every token before them."""
    return hash((parent, tuple(token_ids)))


# --- the four pieces, as plain functions (lab 7 has learners write them; the allocator calls them) ---


def block_hashes(token_ids: Sequence[int], block_size: int, parent: int = NO_PARENT) -> list[int]:
    """The hash chain of the *full* blocks of ``token_ids`` (a last partial block gets none), from ``parent``."""
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


def longest_cached_prefix(
    hashes: Sequence[int], num_prompt_tokens: int, block_size: int, cached: Mapping[int, int]
) -> list[int]:
    """The blocks of the longest run of ``hashes`` found in ``cached`` (hash -> block), from the first.

    The run stops at the first miss, and leaves at least the prompt's last token to compute:
    its logits give the first output token.
    """
    blocks = []
    for key in hashes[: (num_prompt_tokens - 1) // block_size]:
        block = cached.get(key)
        if block is None:
            break
        blocks.append(block)
    return blocks


def release_block(block: int, refs: list[int], is_cached: bool, free: deque[int], evictable: OrderedDict) -> None:
    """Drop one reference to ``block``; the last one puts it on ``free``, or, if it is cached, at the
    most-recent end of ``evictable`` (where it stays findable)."""
    refs[block] -= 1
    if refs[block]:
        return
    if is_cached:
        evictable[block] = None
    else:
        free.append(block)


def pick_block(free: deque[int], evictable: OrderedDict) -> int:
    """Take a block for new tokens: a never-used one first, else the least recently freed cached one."""
    if free:
        return free.popleft()
    block, _ = evictable.popitem(last=False)
    return block


class PrefixCachingBlockAllocator(FreeListBlockAllocator):
    """Blocks with reference counts, a hash map of full blocks, and an LRU list of evictable cached blocks.

    Its four pieces are constructor arguments, labkit's functions above by default, so a learner's own plug
    in (lab 7) with the same signatures: ``block_hashes(token_ids, block_size)``, ``cached_prefix(hashes,
    num_prompt_tokens, block_size, cached)`` (``cached`` read-only), ``release_block(block, refs, is_cached,
    free, evictable)`` and ``pick_block(free, evictable)``.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        *,
        block_hashes: Callable[[list[int], int], list[int]] = block_hashes,
        cached_prefix: Callable[[list[int], int, int, Mapping[int, int]], list[int]] = longest_cached_prefix,
        release_block: Callable[[int, list[int], bool, deque, OrderedDict], None] = release_block,
        pick_block: Callable[[deque, OrderedDict], int] = pick_block,
    ):
        super().__init__(num_blocks, block_size)  # self._free: blocks holding nothing reusable
        self._refs = [0] * num_blocks
        self._content: list[tuple[int, tuple[int, ...]] | None] = [None] * num_blocks  # (parent, tokens)
        self._hash_of: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # hash -> block
        self._evictable: OrderedDict[int, None] = OrderedDict()  # free cached blocks, least recently freed first
        self._chains: dict[str, list[int]] = {}  # seq -> hashes of its full blocks, in order
        self._held: dict[str, list[int]] = {}  # seq -> cached blocks taken for it, not yet in its table
        self.num_evictions = 0
        self.tier: object | None = None  # a slower tier (labkit.kv.tier.KVTier), off by default
        self._reload_policy: ReloadPolicy = reload_or_recompute
        self._spills: dict[int, int] = {}  # block -> hash of the content it held when evicted, not yet copied out
        self._reloads: dict[int, int] = {}  # block -> hash of the content to copy into it from the tier
        self._block_hashes, self._cached_prefix = block_hashes, cached_prefix
        self._release_block, self._pick_block = release_block, pick_block
        self._publish: Callable[[KVEvent], None] | None = None  # told every stored, removed and cleared block

    # --- the four pieces, called through one method each ------------------------------------
    def hash_blocks(self, token_ids: Sequence[int]) -> list[int]:
        """The hashes of the full blocks of ``token_ids``, from the chain's start."""
        return list(self._block_hashes(list(token_ids), self.block_size))

    def find_cached_prefix(self, hashes: list[int], num_prompt_tokens: int) -> list[int]:
        """The cached blocks a prompt of ``num_prompt_tokens`` tokens (full blocks' ``hashes``) can take."""
        return list(
            self._cached_prefix(list(hashes), num_prompt_tokens, self.block_size, MappingProxyType(self._cached))
        )

    def release(self, block: int) -> None:
        """Drop one reference to a block that has one."""
        self._release_block(block, self._refs, self._hash_of[block] is not None, self._free, self._evictable)

    def pick(self) -> int:
        """Take a block off the free or evictable list (at least one is not empty)."""
        return self._pick_block(self._free, self._evictable)

    # --- single blocks ---------------------------------------------------------------
    def allocate_block(self) -> int:
        """A block for new tokens: one holding nothing reusable, else the least recently freed cached one."""
        if not self._free and not self._evictable:
            raise OutOfBlocksError(f"all {self.num_blocks} blocks are in use; free some or preempt a sequence")
        block = self.pick()
        evicted = self._hash_of[block]
        if evicted is not None:  # evicted: its content leaves the map
            del self._cached[evicted]
            self._hash_of[block] = self._content[block] = None
            self.num_evictions += 1
            if self._publish is not None:
                self._publish(BlockRemoved((evicted,)))
            # a block whose reload never ran holds nothing to keep (the tier still has it); any other goes to the tier
            if self._reloads.pop(block, None) is None and self.tier is not None:
                self._spills[block] = evicted
        self._refs[block] = 1
        return block

    def free_block(self, block: int) -> None:
        """Drop one reference; the last one makes the block evictable (if cached) or plainly free."""
        if not (isinstance(block, int) and 0 <= block < self.num_blocks):
            raise ValueError(f"block {block!r} does not belong to this pool (ids 0..{self.num_blocks - 1})")
        if self._refs[block] == 0:
            raise ValueError(f"block {block} is already free (double free)")
        self.release(block)

    def _take(self, block: int) -> None:
        """One more reference to a cached block; a free one leaves the evictable list."""
        if self._refs[block] == 0:
            del self._evictable[block]
        self._refs[block] += 1

    # --- prefix caching ----------------------------------------------------------------
    def take_cached_prefix(self, seq_id: str, token_ids: Sequence[int]) -> int:
        """Hold for ``seq_id`` the longest run of cached full blocks that starts ``token_ids`` (a prompt one token
        short: its logits are needed); return its tokens. The blocks join the table at the next :meth:`allocate`."""
        if seq_id in self._tables or seq_id in self._held:
            raise ValueError(f"sequence {seq_id!r} already holds blocks; look up its prefix before allocating")
        hashes = self.hash_blocks(token_ids)
        held = self._found_blocks(token_ids, hashes, len(token_ids) + 1)
        for block in held:
            self._take(block)
        if self.tier is not None:
            held += self._reload_from_tier(token_ids, hashes, len(held))
        if held:
            self._held[seq_id] = held
            self._chains[seq_id] = hashes[: len(held)]
        return len(held) * self.block_size

    # --- the slower tier -------------------------------------------------------------------
    def attach_tier(self, tier, reload_policy: ReloadPolicy | None = None) -> None:
        """Keep evicted blocks in ``tier`` (it answers ``holds(hash)`` and ``held_run(hashes)``), and reload the
        blocks ``reload_policy`` picks (default :func:`~labkit.kv.tier_policy.reload_or_recompute`: all of them)."""
        if not all(callable(getattr(tier, name, None)) for name in ("holds", "held_run")):
            raise TypeError(f"a KV tier answers holds(hash) and held_run(hashes); {type(tier).__name__} does not")
        self.tier = tier
        self._reload_policy = reload_policy or reload_or_recompute

    def take_tier_moves(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The pending spills and reloads, each ``(hash, block)``, handed over (and forgotten): the runner copies
        them before the next forward pass writes into the pool."""
        spills = [(key, block) for block, key in self._spills.items()]
        reloads = [(key, block) for block, key in self._reloads.items()]
        self._spills, self._reloads = {}, {}
        return spills, reloads

    def _reload_from_tier(self, token_ids: Sequence[int], hashes: list[int], start: int) -> list[int]:
        """Fresh blocks for the run of ``hashes`` after the pool's ``start`` blocks that the tier holds and the
        reload policy picks, each named and noted as a pending reload."""
        tail = []  # the tier's run stops where the pool holds a block again: one hash, one block
        for key in hashes[start:]:
            if key in self._cached:
                break
            tail.append(key)
        run = self.tier.held_run(tail)  # type: ignore[union-attr]
        size = self.block_size
        picked = list(self._reload_policy(len(token_ids) + 1, start * size, run, size))
        if picked != list(range(start, start + len(picked))) or len(picked) > run:
            raise ValueError(
                f"the reload policy picked blocks {picked}, but only a run from block {start} (where the pool's run "
                f"ended) of at most {run} blocks the tier holds can be reloaded: return list(range({start}, {start} + k))"
            )
        blocks = []
        for index in picked[: self.num_free_blocks]:
            block = self.allocate_block()
            parent = hashes[index - 1] if index else NO_PARENT
            self._cached[hashes[index]], self._hash_of[block] = block, hashes[index]
            self._content[block] = (parent, tuple(token_ids[index * size : (index + 1) * size]))
            self._reloads[block] = hashes[index]
            blocks.append(block)
        self._stored(hashes, list(range(start, start + len(blocks))))
        return blocks

    def cached_tokens(self, token_ids: Sequence[int]) -> int:
        """How many tokens of the prompt ``token_ids`` the cache holds now, as the engine would find them when it
        admits the prompt; holds nothing and moves nothing (a router asks every replica this)."""
        return len(self._found_blocks(token_ids, self.hash_blocks(token_ids), len(token_ids))) * self.block_size

    def _found_blocks(self, token_ids: Sequence[int], hashes: list[int], num_prompt_tokens: int) -> list[int]:
        """The cached blocks the prompt can take, stopping where a block's content is not what its hash names."""
        size, parent, found = self.block_size, NO_PARENT, []
        for index, block in enumerate(self.find_cached_prefix(hashes, num_prompt_tokens)):
            tokens = tuple(token_ids[index * size : (index + 1) * size])
            if self._content[block] != (parent, tokens):  # a hash collision: the map's block holds other tokens
                break
            found.append(block)
            parent = hashes[index]
        return found

    def cache_full_blocks(self, seq_id: str, token_ids: Sequence[int]) -> None:
        """Name the sequence's blocks that ``token_ids`` (its tokens now in the cache) fill, so others can find them.

        A block whose name another block already has stays unnamed: the first copy is the one found.
        """
        chain = self._chains.setdefault(seq_id, [])
        table, size = self._tables.get(seq_id, []), self.block_size
        num_full = min(len(token_ids) // size, len(table))
        if num_full <= len(chain):
            return
        hashes = chain + self._hashes_after(chain, token_ids[: num_full * size])
        named = []
        for index in range(len(chain), num_full):
            parent = hashes[index - 1] if index else NO_PARENT
            key, block = hashes[index], table[index]
            chain.append(key)
            if key not in self._cached and self._hash_of[block] is None:
                self._cached[key] = block
                self._hash_of[block] = key
                self._content[block] = (parent, tuple(token_ids[index * size : (index + 1) * size]))
                named.append(index)
        self._stored(hashes, named)

    def _hashes_after(self, chain: list[int], token_ids: Sequence[int]) -> list[int]:
        """The hashes of the full blocks of ``token_ids`` past the ``chain`` already named: labkit's hash function
        continues the chain from its last link (a decode names one block, not the whole prefix again); a learner's,
        which takes no parent, hashes from the start."""
        if self._block_hashes is block_hashes:
            return block_hashes(
                token_ids[len(chain) * self.block_size :], self.block_size, chain[-1] if chain else NO_PARENT
            )
        return self.hash_blocks(token_ids)[len(chain) :]

    # --- events (vLLM's KV events) ---------------------------------------------------------
    def publish_events(self, publish: Callable[[KVEvent], None]) -> None:
        """Tell ``publish`` every change to what the cache can find from now on, after one ``BlockStored`` per block
        it holds already (so a reader that starts here knows everything)."""
        self._publish = publish
        for key, block in self._cached.items():
            parent = self._content[block][0]  # type: ignore[index]  # a named block has its content
            publish(BlockStored((key,), None if parent == NO_PARENT else parent, self.block_size))

    def _stored(self, hashes: list[int], positions: list[int]) -> None:
        """Publish the blocks just named (their positions in the chain ``hashes``), one event per unbroken run."""
        if self._publish is None:
            return
        runs: list[list[int]] = []
        for index in positions:
            if runs and runs[-1][-1] == index - 1:
                runs[-1].append(index)
            else:
                runs.append([index])
        for run in runs:
            parent = hashes[run[0] - 1] if run[0] else None
            self._publish(BlockStored(tuple(hashes[i] for i in run), parent, self.block_size))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (vLLM's ``reset_prefix_cache``); False, and nothing forgotten, while a sequence
        holds blocks (their names are in use)."""
        if self.num_used_blocks or self._held:
            return False
        for block in self._evictable:
            self._hash_of[block] = self._content[block] = None
            self._free.append(block)
        self._evictable.clear()
        self._cached.clear()
        if self._publish is not None:
            self._publish(AllBlocksCleared())
        return True

    # --- sequences -------------------------------------------------------------------
    def allocate(self, seq_id: str, num_tokens: int) -> list[int]:
        """Grow the table to hold ``num_tokens`` tokens, blocks taken by :meth:`take_cached_prefix` first."""
        held = self._held.get(seq_id)
        if held and self.num_new_blocks(seq_id, num_tokens) - len(held) <= self.num_free_blocks:  # else, all or
            self._tables.setdefault(seq_id, []).extend(self._held.pop(seq_id))  # nothing: super() raises
        return super().allocate(seq_id, num_tokens)

    def free(self, seq_id: str) -> None:
        """Let go of every block of a sequence, last block first: a prefix's tail is evicted before its head,
        which more requests are likely to share."""
        blocks = self._held.pop(seq_id, []) + self._tables.pop(seq_id, [])
        self._chains.pop(seq_id, None)
        for block in reversed(blocks):
            self.free_block(block)

    # --- usage ---------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence references: never used, or cached and evictable."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks whose content the map can find (referenced or evictable)."""
        return len(self._cached)

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def pool_state(self) -> dict[str, object]:
        """The pool as plain data, for a check that compares two pools call by call: ref counts, the free list and
        the evictable list in order, each sequence's table, the cached blocks, the evictions so far."""
        return {
            "refs": list(self._refs),
            "free": list(self._free),
            "evictable": list(self._evictable),
            "tables": {seq: list(table) for seq, table in sorted(self._tables.items())},
            "cached": sorted(self._cached.values()),
            "evictions": self.num_evictions,
        }
