"""Undo the KV cache of rejected draft tokens: the verification pass wrote K/V for every draft token.

The cached K/V of a rejected token (and of every token after it) describe a sequence that will never
exist. Nothing needs erasing: moving ``num_computed_tokens`` back makes the next step overwrite
those slots, and blocks that now hold only such slots go back to the pool, through the allocator's
declared ``free_tail`` (see :class:`labkit.engine.interfaces.TailFreeingAllocator`; an allocator without it
is handed over as :class:`labkit.engine.speculation.TailKeeping`).
"""

from __future__ import annotations


def rollback(request, num_rejected: int, blocks) -> None:
    """Undo the KV of rejected draft tokens: move request.num_computed_tokens back by num_rejected and return to the
    allocator `blocks` every block the request no longer needs."""
    if not 0 <= num_rejected <= request.num_computed_tokens:
        raise ValueError(f"cannot roll back {num_rejected} tokens of a request with {request.num_computed_tokens}")
    request.num_computed_tokens -= num_rejected
    blocks.free_tail(request.request_id, -(-request.num_computed_tokens // blocks.block_size))
