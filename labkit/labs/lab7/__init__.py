"""Lab 7, prefix caching: its three exercises' checks, a module each (importing this package registers them). Each
compares the learner's function with labkit's own on seeded cases, then serves chats that share a system prompt
with it plugged into labkit's prefix-caching allocator (:mod:`~labkit.labs.lab7.served`)."""

# the exercises register in the order the notebook shows them, not sorted
from labkit.labs.lab7 import hashes  # noqa: F401, I001
from labkit.labs.lab7 import prefix  # noqa: F401
from labkit.labs.lab7 import lru_free  # noqa: F401
