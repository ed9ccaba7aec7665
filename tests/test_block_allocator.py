"""The block allocator: tables grow block by block, nothing is freed twice, nothing leaks."""

import pytest

from labkit.kv.block_allocator import FreeListBlockAllocator, OutOfBlocksError


def test_tables_grow_one_block_per_block_size_tokens():
    blocks = FreeListBlockAllocator(num_blocks=8, block_size=4)
    assert blocks.allocate("a", 1) == blocks.block_table("a") and len(blocks.block_table("a")) == 1
    assert len(blocks.allocate("a", 4)) == 1  # still fits in the first block
    assert len(blocks.allocate("a", 5)) == 2  # the fifth token opens a second block
    assert blocks.num_new_blocks("a", 12) == 1
    assert blocks.num_used_blocks == 2 and blocks.num_free_blocks == 6 and blocks.usage == 0.25


def test_sequences_never_share_a_block_and_free_returns_everything():
    blocks = FreeListBlockAllocator(num_blocks=10, block_size=2)
    for name, tokens in [("a", 5), ("b", 4), ("c", 7)]:
        blocks.allocate(name, tokens)
    owned = blocks.block_table("a") + blocks.block_table("b") + blocks.block_table("c")
    assert len(owned) == len(set(owned)) == 9
    for name in "abc":
        blocks.free(name)
    assert blocks.num_free_blocks == 10 and blocks.block_table("a") == []


def test_exhaustion_is_all_or_nothing():
    blocks = FreeListBlockAllocator(num_blocks=3, block_size=4)
    blocks.allocate("a", 8)
    assert not blocks.can_allocate("b", 8)
    with pytest.raises(OutOfBlocksError, match="needs 2 more blocks but only 1"):
        blocks.allocate("b", 8)
    assert blocks.num_free_blocks == 1 and blocks.block_table("b") == []  # nothing taken
    blocks.allocate_block()
    with pytest.raises(OutOfBlocksError):
        blocks.allocate_block()


def test_double_free_and_foreign_blocks_are_refused():
    blocks = FreeListBlockAllocator(num_blocks=4)
    block = blocks.allocate_block()
    blocks.free_block(block)
    with pytest.raises(ValueError, match="double free"):
        blocks.free_block(block)
    with pytest.raises(ValueError, match="does not belong"):
        blocks.free_block(4)
    with pytest.raises(ValueError, match="does not belong"):
        blocks.free_block(-1)


def test_no_leak_over_many_cycles():
    blocks = FreeListBlockAllocator(num_blocks=16, block_size=4)
    for cycle in range(50):
        for seq in range(4):
            blocks.allocate(f"{cycle}-{seq}", 1 + (cycle * 7 + seq * 3) % 16)
        for seq in range(4):
            blocks.free(f"{cycle}-{seq}")
    assert blocks.num_free_blocks == 16
    assert sorted(blocks.allocate_block() for _ in range(16)) == list(range(16))


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="num_blocks"):
        FreeListBlockAllocator(0)
