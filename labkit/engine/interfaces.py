"""The engine's plug-in seams, declared: what a learner's allocator, attention, policy, victim chooser or proposer
must offer, and the one check that says so at construction, not with an AttributeError mid-run.

Each lab replaces one part of a working engine (lab 4 the policy and the victim chooser, lab 5 the block
allocator and attention, lab 6 the chunked policy, lab 7 the prefix cache, lab 8 speculation). The
:class:`typing.Protocol` classes below say which calls the engine makes on each part, what it guarantees
when it makes them, and what it expects back. :func:`check_parts` holds the parts plugged into one engine
against them, for the features that are on. Plain Python, no torch: the simulator shares it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from labkit.engine.request import Request
    from labkit.engine.state import SchedulerOutput, SchedulerState


@runtime_checkable
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
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds."""
        ...

    @property
    def num_used_blocks(self) -> int:
        """Blocks some sequence holds (each step's record notes it)."""
        ...


@runtime_checkable
class TailFreeingAllocator(BlockAllocator, Protocol):
    """An allocator that can give back the end of a table: speculation's rollback (lab 8) uses it.

    Optional: without it the blocks of rejected drafts stay with the sequence until it frees them
    (its next tokens are written into them), see :func:`labkit.spec.rollback.rollback_blocks`.
    """

    def free_tail(self, seq_id: str, keep: int) -> None:
        """Give back the sequence's blocks after its first ``keep`` ones, last first. The engine keeps
        every block that holds a computed token, so the blocks given back hold only rejected drafts."""
        ...


@runtime_checkable
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


class Attention(Protocol):
    """The attention of one layer over the paged cache (lab 5 builds a per-sequence one)."""

    def __call__(self, layer: int, q: Any, k_pool: Any, v_pool: Any, batch: Any, /) -> Any:
        """``q`` [tokens, query heads, head_dim] for the step's flat batch; ``k_pool`` and ``v_pool``
        [num_blocks, block_size, kv heads, head_dim] already hold the step's new K/V; ``batch`` is the
        step's :class:`~labkit.kv.paged.PagedBatch` (block tables, context lengths); with an 8-bit cache
        (``kv_cache_dtype="fp8"``) the pools hold only the step's blocks, dequantized, and the batch's block
        tables are renumbered into them, so the function reads the model's dtype either way. Returns a tensor
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
    """Speculative decoding's drafting side, as the step loop sees it (no tensors): see :mod:`labkit.spec`."""

    num_speculative_tokens: int

    def propose(self, request: Request, k: int) -> tuple[list[int], object]:
        """Up to ``k`` draft tokens to follow ``request``'s sequence, and their draft probabilities (or None).
        Called for every decoding request each step; ``k`` already leaves room under max_tokens."""
        ...

    def rollback(self, request: Request, num_rejected: int, blocks: TailFreeingAllocator) -> None:
        """Undo the KV of ``num_rejected`` draft tokens (see :func:`labkit.spec.rollback`)."""
        ...


class MissingPartError(TypeError):
    """A plugged-in part lacks a call that a feature which is on needs."""


# feature -> (the part, the calls it needs, the lab where learners build them, whether a dial turns it off)
_NEEDS: dict[str, tuple[str, tuple[str, ...], str, bool]] = {
    "serving": (
        "block allocator",
        ("block_table", "can_allocate", "allocate", "free", "num_blocks", "block_size", "num_used_blocks"),
        "lab 5",
        False,
    ),
    "prefix caching": ("block allocator", ("take_cached_prefix", "cache_full_blocks"), "lab 7", True),
    "scheduling": ("scheduler policy", ("schedule", "name", "chunked"), "lab 4", False),
    "chunked prefill": ("scheduler policy", ("schedule", "name", "chunked"), "lab 6", False),
    "speculative decoding": ("proposer", ("propose", "rollback", "num_speculative_tokens"), "lab 8", True),
}
_DATA = {"num_blocks", "block_size", "num_used_blocks", "name", "chunked", "num_speculative_tokens"}


def missing(part: object, names: Sequence[str]) -> list[str]:
    """The names ``part`` lacks; a method the engine calls must also be callable."""
    return [
        name for name in names if not hasattr(part, name) or (name not in _DATA and not callable(getattr(part, name)))
    ]


def require(part: object, feature: str) -> None:
    """Refuse ``part`` if it lacks a call that ``feature`` (a key of the table above) needs."""
    what, names, lab, optional = _NEEDS[feature]
    absent = missing(part, names)
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

    Speculation's ``free_tail`` is optional (an allocator without it keeps rejected drafts' blocks until the
    sequence ends), and so is nothing else.
    """
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
