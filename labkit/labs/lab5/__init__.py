"""Lab 5, PagedAttention: its three exercises' checks, a module each (importing this package registers them)."""

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
