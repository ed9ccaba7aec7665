"""Lab 7, prefix caching: the checks for the learner's hash chain, prefix lookup and ref-count / LRU free.

Three exercises, each checked in its own module (importing this package registers all three checks, in the order
the notebook shows them):

- ``block_hashes`` (``lab7.block_hashes``, :mod:`~labkit.labs.lab7.hashes`): one hash per *full* block, each of its
  parent's hash and its own tokens;
- ``cached_prefix`` (``lab7.cached_prefix``, :mod:`~labkit.labs.lab7.prefix`): the blocks of the longest run of
  hashes found in the map, stopping at the first miss and leaving at least the prompt's last token to compute;
- ``release_block`` and ``pick_block`` (``lab7.lru_free``, :mod:`~labkit.labs.lab7.lru_free`): a shared block is
  freed by its last holder; a freed block with a hash waits, findable, on an LRU list; new blocks come from the
  never-used ones first, then from the least recently freed cached one.

Each check compares the learner's function with labkit's own on seeded cases, names the typical
mistakes, then plugs it into labkit's prefix-caching allocator
(:func:`~labkit.labs.lab7.runs.allocator_with`) and serves seeded chats that share a
system prompt on the tiny model: the same tokens, and the same prompt tokens found in the cache,
request by request, as the engine with its own allocator (:mod:`~labkit.labs.lab7.served`).
"""

# the exercises register in the order the notebook shows them, not sorted
from labkit.labs.lab7 import hashes  # noqa: F401, I001
from labkit.labs.lab7 import prefix  # noqa: F401
from labkit.labs.lab7 import lru_free  # noqa: F401
