"""The bytes one decode step's attention reads, per layer: labkit's gather-then-SDPA path against the kernel.

Decode is bound by memory bandwidth, so bytes are its cost. The gather path reads every block of
every sequence's table, padded to the longest (one SDPA call needs one width), writes that copy to a
buffer, and reads the copy again in SDPA: the keys and values cross the memory bus three times,
padding included. The kernel (:mod:`labkit.kernels.paged_decode`) reads each sequence's keys and
values once, where they lie, and only the slots that hold tokens. Counted per layer:

- **kernel**: keys and values (2 x tokens x KV heads x head_dim x dtype bytes), every query once, and
  each (sequence, KV head) program's block-table entries and context length (int32);
- **gather**: the padded blocks read from the pool and read again from the copy (2 x 2 x width x
  block_size x KV heads x head_dim x dtype bytes a sequence), the block tables (int64, padded), every
  query once; the copy's writes are counted apart (``gather_written``).

Achieved bandwidth is bytes read over seconds taken; a GPU's fraction of its peak says how close the
kernel comes to the card's limit (only a GPU's timing means anything: the interpreter's do not).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

INT32, INT64 = 4, 8


@dataclass(frozen=True)
class DecodeShape:
    """One layer's decode step: each sequence's context, the attention heads, and the cache's layout."""

    context_lens: Sequence[int]
    block_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2  # bf16/fp16 on a GPU


def kernel_bytes(shape: DecodeShape) -> int:
    """Bytes the paged decode kernel reads: each sequence's keys and values once, queries, tables and lengths."""
    row = shape.num_kv_heads * shape.head_dim * shape.dtype_bytes  # one token's keys (or values), all KV heads
    total = 0
    for length in shape.context_lens:
        blocks = -(-length // shape.block_size)
        total += 2 * length * row + shape.num_heads * shape.head_dim * shape.dtype_bytes
        total += shape.num_kv_heads * (blocks * INT32 + INT32)  # each program reads its table and its length
    return total


def gather_bytes(shape: DecodeShape) -> tuple[int, int]:
    """(bytes read, bytes written) by the gather-then-SDPA path, with every table padded to the longest."""
    width = max(-(-length // shape.block_size) for length in shape.context_lens)
    padded = 2 * width * shape.block_size * shape.num_kv_heads * shape.head_dim * shape.dtype_bytes
    queries = shape.num_heads * shape.head_dim * shape.dtype_bytes
    num_seqs = len(shape.context_lens)
    read = num_seqs * (2 * padded + width * INT64 + queries)  # the pool, then the copy; tables; queries
    return read, num_seqs * padded


def decode_bytes(shape: DecodeShape) -> dict[str, int]:
    """Both paths' bytes for one layer's decode step: ``kernel``, ``gather`` (read) and ``gather_written``."""
    read, written = gather_bytes(shape)
    return {"kernel": kernel_bytes(shape), "gather": read, "gather_written": written}


def achieved_bandwidth(num_bytes: int, seconds: float) -> float:
    """Bytes per second actually moved: compare with the card's peak (its HBM bandwidth) for the fraction."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return num_bytes / seconds
