"""The engine's plug-in seams, declared: what a learner's allocator, attention, policy, victim chooser, proposer
or router must offer, and the one check that says so at construction, not with an AttributeError mid-run.

Each lab replaces one part of a working engine (lab 4 the policy and the victim chooser, lab 5 the block
allocator and attention, lab 6 the chunked policy, lab 7 the prefix cache, lab 8 speculation). The
:class:`typing.Protocol` classes below are the contract, stated once: which calls the engine makes on each part,
what it guarantees then, and what it expects back. :func:`check_parts` reads the calls off them. Plain Python, no
torch: the simulator shares it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from labkit.engine.request import Request
    from labkit.engine.state import SchedulerOutput, SchedulerState


class BlockAllocator(Protocol):
    """Fixed-size KV blocks handed out to sequences, one block table each (lab 5 builds one).

    The engine calls these from the scheduler's moves (admit, reserve, preempt, finish) and the
    model runner; it never asks for more blocks than ``can_allocate`` allowed.
    """

    num_blocks: int  # the pool's size, fixed
    block_size: int  # token slots per block, fixed

    def block_table(self, seq_id: str) -> Sequence[int]:
        """The sequence's blocks in order (token t lives in block ``table[t // block_size]``); empty if none.
        The engine only reads it."""
        ...

    def can_allocate(self, seq_id: str, num_tokens: int) -> bool:
        """Whether ``allocate(seq_id, num_tokens)`` would succeed now (the sequence's own blocks count)."""
        ...

    def allocate(self, seq_id: str, num_tokens: int) -> Sequence[int]:
        """Grow the sequence's table to hold ``num_tokens`` tokens; the blocks it has keep their place.
        Called only after ``can_allocate`` said yes; ``num_tokens`` never shrinks between calls."""
        ...

    def free(self, seq_id: str) -> None:
        """Give back every block of the sequence (it finished, was preempted or aborted)."""
        ...

    @property
    def num_used_blocks(self) -> int:
        """Blocks some sequence holds (each step's record notes it)."""
        ...


class TailFreeingAllocator(BlockAllocator, Protocol):
    """An allocator that can give back the end of a table: speculation's rollback (lab 8) uses it.

    Optional: without it the blocks of rejected drafts stay with the sequence until it frees them
    (its next tokens are written into them), see :func:`labkit.engine.speculation.rollback_blocks`.
    """

    def free_tail(self, seq_id: str, keep: int) -> None:
        """Give back the sequence's blocks after its first ``keep`` ones, last first. The engine keeps
        every block that holds a computed token, so the blocks given back hold only rejected drafts."""
        ...


class PrefixCachingAllocator(BlockAllocator, Protocol):
    """An allocator that remembers full blocks by their content (lab 7 builds its pieces)."""

    def take_cached_prefix(self, seq_id: str, token_ids: Sequence[int]) -> int:
        """Hold for ``seq_id`` the longest run of cached full blocks that starts ``token_ids`` and return its
        tokens (a multiple of block_size). Called for the head of the queue before it holds any block, with
        its prompt one token short; the blocks join its table at its next ``allocate``."""
        ...

    def cache_full_blocks(self, seq_id: str, token_ids: Sequence[int]) -> None:
        """Name the sequence's full blocks that ``token_ids`` (all its tokens now computed and final) fill.
        Called after a step that filled a block of the sequence."""
        ...


class KVTier(Protocol):
    """A slower, bounded tier for the K/V of evicted prefix blocks, keyed by block hash (see :mod:`labkit.kv.tier`).

    The allocator asks it only which hashes it holds (plain Python); the model runner moves the data."""

    capacity_blocks: int  # the most blocks it holds; the least recently used is dropped for a new one

    def holds(self, key: int) -> bool:
        """Whether it has the block named ``key``; changes nothing."""
        ...

    def held_run(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes``, from the first, it holds in a row (a lookup: its counters note it)."""
        ...

    def stats(self) -> dict[str, Any]:
        """Its counters (spilled, reloaded, misses, dropped, queried) and occupancy, as plain values."""
        ...


class TieredPrefixCachingAllocator(PrefixCachingAllocator, Protocol):
    """A prefix-caching allocator that keeps evicted blocks in a :class:`KVTier` and finds them there again.

    Evicting a cached block notes a pending spill ``(hash, block)``; where ``take_cached_prefix``'s run in the
    pool ends, the chain goes on in the tier: the blocks found there (and picked by the reload policy) are taken
    fresh, named, and noted as pending reloads, and their tokens count as cached. The engine takes the pending
    moves before each forward pass and copies them (spills out of the pool before anything overwrites them,
    reloads in before attention reads them)."""

    def attach_tier(self, tier: KVTier, reload_policy: Callable[[int, int, int, int], Sequence[int]] | None) -> None:
        """Use ``tier`` from now on; ``reload_policy(prompt_tokens, cached_tokens, tier_blocks, block_size)`` gives
        the positions of the blocks to reload (a run starting where the pool's run ended), None for the default."""
        ...

    def take_tier_moves(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The pending spills and reloads as ``(hash, block)`` pairs, handed over once (then forgotten)."""
        ...


class PrefixCacheLookup(Protocol):
    """An allocator that can say, without holding anything, how much of a prompt it has cached (a router asks)."""

    def cached_tokens(self, token_ids: Sequence[int]) -> int:
        """Tokens of the prompt ``token_ids`` that ``take_cached_prefix`` would find now (a multiple of block_size)."""
        ...


class Attention(Protocol):
    """The attention of one layer over the paged cache (lab 5 builds a per-sequence one)."""

    def __call__(self, layer: int, q: Any, k_pool: Any, v_pool: Any, batch: Any, /) -> Any:
        """``q`` [tokens, query heads, head_dim] for the step's flat batch; ``k_pool`` and ``v_pool``
        [num_blocks, block_size, kv heads, head_dim] already hold the step's new K/V; ``batch`` is the
        step's :class:`~labkit.kv.paged_batch.PagedBatch` (block tables, context lengths); with a narrower
        cache (``kv_cache_dtype="fp8"``, or "bfloat16" under fp32) the pools hold only the step's blocks, widened,
        and the batch's block tables are renumbered into them, so the function reads the model's dtype either way. Returns a tensor
        shaped like ``q``: row i attends to its own sequence's keys up to its own position. Called with
        positional arguments only (the ``/``), so a plain function with any parameter names fits."""
        ...


class SchedulerPolicy(Protocol):
    """Who runs this step and how many tokens each computes (lab 4 builds one, lab 6 a chunked one)."""

    name: str  # shown in describe() and progress bars
    chunked: bool  # True: it may split a prompt over steps, so the token budget may be below max_model_len

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        """Plan one step: move requests with the state's moves (``admit``, ``reserve``) and return the
        tokens each computes. Called once per step after arrivals joined and the head took its cached
        prefix; it must schedule something whenever requests are unfinished."""
        ...


class VictimChooser(Protocol):
    """Whom to preempt when the blocks run out (lab 4 builds one)."""

    def __call__(self, state: SchedulerState, request: Request) -> Request:
        """One of ``state.running`` to preempt so that ``request`` (running, being given its tokens) can
        grow; called again while blocks are still short. Returning ``request`` itself gives up its turn."""
        ...


class Proposer(Protocol):
    """Speculative decoding's drafting side, as the step loop sees it (no tensors): see :mod:`labkit.speculative`."""

    num_speculative_tokens: int

    def propose(self, request: Request, k: int) -> tuple[list[int], object]:
        """Up to ``k`` draft tokens to follow ``request``'s sequence, and their draft probabilities (or None).
        Called for every decoding request each step; ``k`` already leaves room under max_tokens."""
        ...

    def rollback(self, request: Request, num_rejected: int, blocks: TailFreeingAllocator) -> None:
        """Undo the KV of ``num_rejected`` draft tokens (see :func:`labkit.speculative.rollback`)."""
        ...


class Router(Protocol):
    """Which replica serves a request that has just arrived (the fleet's seam: round-robin, least-loaded and a
    router that looks for the cache are each a few lines over it, see :mod:`labkit.engine.fleet`). The same
    objects route the engines' and the simulator's fleets and ``labkit route``'s replicas over HTTP."""

    name: str  # shown in the fleet's trace and progress bar

    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        """The index of the replica that serves ``request``. Called once per request, in order of arrival, with
        what each replica looks like at that moment; the answer must be ``0 <= index < len(replicas)``."""
        ...


@dataclass(frozen=True)
class RequestView:
    """One request as a router sees it when it arrives: what it may know before tokenizing, and after.

    The engines' and the simulator's fleets route requests already tokenized (``prompt_text`` too where the prompt
    came as text). ``labkit route`` reads the HTTP body: ``prompt_text`` always (a chat flattened,
    :func:`labkit.serve.router_policies.prompt_text`), ``prompt_token_ids`` where it tokenizes (``cache_aware``).
    """

    request_id: str
    prompt_text: str | None = None  # before tokenizing: the prompt as text; None where it came as token ids
    prompt_token_ids: tuple[int, ...] | None = None  # after tokenizing; None where the router does not tokenize


@dataclass(frozen=True)
class ReplicaView:
    """One replica as a router sees it when a request arrives: how busy it is and what it has cached for it.

    In the engines' and the simulator's fleets both fields come from the replica itself. ``labkit route`` sees
    its replicas from outside: the requests it has in flight there, and what the replica's KV events say it
    holds, or a guess from the prompts it sent there (:mod:`labkit.serve.router_caches`).
    """

    index: int
    unfinished: int  # requests routed there and not finished (queued, running or not yet arrived)
    cached_tokens: int  # tokens of this request's prompt already in its prefix cache (0 without prefix caching)


class MissingPartError(TypeError):
    """A plugged-in part lacks a call that a feature which is on needs."""


def members(protocol: type) -> tuple[str, ...]:
    """The calls and data a protocol declares, its bases' included: its methods (in order), then its data.

    Read off the class, so the contract is stated once, in the protocol; data is an annotation or a property.
    """
    methods: list[str] = []
    data: list[str] = []
    for cls in reversed(protocol.__mro__):
        if not getattr(cls, "_is_protocol", False) or cls is Protocol:
            continue
        data += [name for name in getattr(cls, "__annotations__", {}) if name not in data]
        for name, value in vars(cls).items():
            if name.startswith("_") or name in methods or name in data:
                continue
            (data if isinstance(value, property) else methods).append(name)
    return (*methods, *data)


def missing(part: object, protocol: type) -> list[str]:
    """The members of ``protocol`` that ``part`` lacks; a method the engine calls must also be callable."""
    return [
        name
        for name in members(protocol)
        if not hasattr(part, name)
        or (inspect.isfunction(getattr(protocol, name, None)) and not callable(getattr(part, name)))
    ]


def implements(part: object, protocol: type) -> bool:
    """Whether ``part`` offers every call of ``protocol``, subclass or not (for the optional seams)."""
    return not missing(part, protocol)


# feature -> (the protocol its part must follow, the part's name, the lab where learners build it, whether a
# dial turns the feature off)
_FEATURES: dict[str, tuple[type, str, str, bool]] = {
    "serving": (BlockAllocator, "block allocator", "lab 5", False),
    "prefix caching": (PrefixCachingAllocator, "block allocator", "lab 7", True),
    "scheduling": (SchedulerPolicy, "scheduler policy", "lab 4", False),
    "chunked prefill": (SchedulerPolicy, "scheduler policy", "lab 6", False),
    "speculative decoding": (Proposer, "proposer", "lab 8", True),
    "routing": (Router, "router", "the routers of labkit.engine.fleet", False),
    "kv offloading": (TieredPrefixCachingAllocator, "block allocator", "labkit.kv.prefix_cache", True),
}


def require(part: object, feature: str) -> None:
    """Refuse ``part`` if it lacks a call that ``feature`` (a key of the table above) needs."""
    protocol, what, lab, optional = _FEATURES[feature]
    absent = missing(part, protocol)
    if absent:
        them = "it" if len(absent) == 1 else "them"
        raise MissingPartError(
            f"{feature} needs the {what} to have {', '.join(absent)}, and {type(part).__name__} lacks {them}; "
            f"add {them} as {lab} builds {them} (see labkit.engine.interfaces)"
            + (f", or turn {feature} off" if optional else "")
        )


def require_callable(part: object, what: str, lab: str) -> None:
    """Refuse a function-shaped part (attention, victim chooser) that is not callable."""
    if not callable(part):
        raise MissingPartError(
            f"the {what} must be a function, got {type(part).__name__}; write it as {lab} does "
            "(see labkit.engine.interfaces)"
        )


def check_parts(
    *,
    blocks: object,
    policy: object,
    attention: Callable | None = None,
    choose_victim: Callable | None = None,
    proposer: object | None = None,
    enable_prefix_caching: bool = False,
) -> None:
    """Hold the parts of one engine against their protocols, for the features that are on; called once when
    the engine is built, so a missing call is a :class:`MissingPartError` naming it, its feature and its lab.
    Only speculation's ``free_tail`` is optional (see :class:`TailFreeingAllocator`)."""
    require(blocks, "serving")
    if enable_prefix_caching:
        require(blocks, "prefix caching")
    require(policy, "chunked prefill" if getattr(policy, "chunked", False) else "scheduling")
    if attention is not None:
        require_callable(attention, "attention", "lab 5")
    if choose_victim is not None:
        require_callable(choose_victim, "victim chooser (choose_victim)", "lab 4")
    if proposer is not None:
        require(proposer, "speculative decoding")
