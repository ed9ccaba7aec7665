"""Hand out fixed-size KV blocks to sequences, PagedAttention style: a sequence owns a list of blocks (its *block
table*), grown one block at a time, so none reserves memory it does not use yet. Plain Python, no tensors: the
engine and the simulator share it, and lab 5 has learners write their own.
"""

from __future__ import annotations

from collections import deque


class OutOfBlocksError(RuntimeError):
    """Asked for a block when none is free."""


class FreeListBlockAllocator:
    """A free list of block ids plus one block table per sequence."""

    def __init__(self, num_blocks: int, block_size: int = 16):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._is_free = [True] * num_blocks
        self._tables: dict[str, list[int]] = {}

    # --- single blocks ---------------------------------------------------------------
    def allocate_block(self) -> int:
        if not self._free:
            raise OutOfBlocksError(f"all {self.num_blocks} blocks are in use; free some or preempt a sequence")
        block = self._free.popleft()
        self._is_free[block] = False
        return block

    def free_block(self, block: int) -> None:
        if not (isinstance(block, int) and 0 <= block < self.num_blocks):
            raise ValueError(f"block {block!r} does not belong to this pool (ids 0..{self.num_blocks - 1})")
        if self._is_free[block]:
            raise ValueError(f"block {block} is already free (double free)")
        self._is_free[block] = True
        self._free.append(block)

    # --- sequences and their block tables ---------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` token slots."""
        return -(-num_tokens // self.block_size)

    def block_table(self, seq_id: str) -> list[int]:
        """The blocks a sequence owns, in order: token t lives in block table[t // block_size]."""
        return self._tables.get(seq_id, [])

    def num_new_blocks(self, seq_id: str, num_tokens: int) -> int:
        """Blocks a sequence still lacks to hold ``num_tokens`` tokens."""
        return max(0, self.blocks_for(num_tokens) - len(self.block_table(seq_id)))

    def can_allocate(self, seq_id: str, num_tokens: int) -> bool:
        return self.num_new_blocks(seq_id, num_tokens) <= self.num_free_blocks

    def allocate(self, seq_id: str, num_tokens: int) -> list[int]:
        """Grow ``seq_id``'s table to hold ``num_tokens`` tokens; all or nothing. Returns the table."""
        needed = self.num_new_blocks(seq_id, num_tokens)
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(
                f"sequence {seq_id!r} needs {needed} more blocks but only "
                f"{self.num_free_blocks} are free; preempt a sequence first"
            )
        table = self._tables.setdefault(seq_id, [])
        table.extend(self.allocate_block() for _ in range(needed))
        return table

    def free_tail(self, seq_id: str, keep: int) -> None:
        """Give back a sequence's blocks after its first ``keep``, last first (speculation's rollback)."""
        table = self._tables.get(seq_id, [])
        while len(table) > keep:
            self.free_block(table.pop())

    def free(self, seq_id: str) -> None:
        """Give back every block of a sequence (it finished or was preempted)."""
        for block in self._tables.pop(seq_id, []):
            self.free_block(block)

    # --- usage ---------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks some sequence holds (KV cache usage counts only these)."""
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (vLLM's kv_cache_usage_perc, as 0..1)."""
        return self.num_used_blocks / self.num_blocks

    def __repr__(self) -> str:
        return (
            f"FreeListBlockAllocator({self.num_used_blocks}/{self.num_blocks} blocks used, "
            f"block_size={self.block_size}, {len(self._tables)} sequences)"
        )
