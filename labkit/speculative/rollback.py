"""Undo the KV cache of rejected draft tokens: nothing needs erasing, since moving ``num_computed_tokens`` back makes
the next step overwrite their slots; blocks left holding only such slots go back through the allocator's
``free_tail`` (:class:`labkit.engine.interfaces.TailFreeingAllocator`).
"""

from __future__ import annotations


def rollback(request, num_rejected: int, blocks) -> None:
    """Undo the KV of rejected draft tokens: move request.num_computed_tokens back by num_rejected and return to the
    allocator `blocks` every block the request no longer needs."""
    if not 0 <= num_rejected <= request.num_computed_tokens:
        raise ValueError(f"cannot roll back {num_rejected} tokens of a request with {request.num_computed_tokens}")
    request.num_computed_tokens -= num_rejected
    blocks.free_tail(request.request_id, -(-request.num_computed_tokens // blocks.block_size))
