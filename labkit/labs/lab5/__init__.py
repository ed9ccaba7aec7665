"""Lab 5, PagedAttention: the checks for its three exercises, a module each (importing this package registers all three).

- ``PagedBlockAllocator`` (:mod:`~labkit.labs.lab5.allocator`): blocks handed out on demand from a free list, one
  block table per sequence, every block back on the free list when the sequence ends. Checked on a seeded script
  of allocations and frees (the tables are watched after every call) and inside the engine.
- ``slot_mapping`` (:mod:`~labkit.labs.lab5.slots`): where token ``pos`` of a sequence lives:
  ``table[pos // B] * B + pos % B``.
- ``paged_attention`` (:mod:`~labkit.labs.lab5.paged_attention`): one sequence's attention, its keys and values
  gathered from the pools through its block table; checked against dense attention and inside the engine.
"""

from __future__ import annotations

# the exercises number in the order their modules are imported: the notebook's
# isort: off
from labkit.labs.lab5 import allocator  # noqa: F401
from labkit.labs.lab5.slots import _slots
from labkit.labs.lab5.paged_attention import engine_attention
# isort: on

# the course's slot mapping by the name its exercise declares (labkit.labs.lab5._slots), and the plug that puts a
# one-sequence attention in the engine (the tests of the engine's seams use it)
__all__ = ["_slots", "engine_attention"]
