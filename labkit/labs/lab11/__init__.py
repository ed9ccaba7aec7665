"""Lab 11, the kernel: PagedAttention's decode step as a GPU runs it, written in Triton and checked on any CPU.

Three exercises, each checked in its own module (importing this package registers all three checks, in the order
the notebook shows them):

- ``paged_decode_kernel`` (``lab11.paged_decode``, :mod:`~labkit.labs.lab11.paged_decode`): one program per
  (sequence, KV head) walks the block table, loads each block's keys and values where they lie, masks the last
  block's empty slots, and keeps a running softmax for the group of query heads that share the KV head. Checked
  under Triton's interpreter on seeded cases (random block tables, contexts that end mid-block, one to three query
  heads per KV head, scores large enough to overflow ``exp`` without the running max, a first block far above the
  rest, bf16 pools) against labkit's reference, and inside the engine.
- ``split_kv_kernel`` and ``merge_splits_kernel`` (``lab11.split_kv``, :mod:`~labkit.labs.lab11.split_kv`):
  split-KV ("flash-decoding"): each split keeps its partial max, sum and weighted values; the merge brings them to
  one max. Checked with one, three and five splits (not powers of two, some empty), large scores and bf16.
- ``decode_bytes`` (``lab11.decode_bytes``, :mod:`~labkit.labs.lab11.bytes_read`): the bytes one layer's decode
  step reads, kernel against gather-then-SDPA.

Both kernel checks grade kernels, not only outputs: the exercise cell's source, read as data, must hold Triton
kernels only, and they must compile for an H100 (:mod:`~labkit.labs.lab11.compiled`). Their seeded cases and
comparison are in :mod:`~labkit.labs.lab11.kernel_cases`; each wrong answer is compared with the typical mistakes
(simulated in :mod:`~labkit.labs.lab11.variants`) so the message names the one it shows.
"""

# the exercises register in the order the notebook shows them, not sorted
from labkit.labs.lab11 import paged_decode  # noqa: F401, I001
from labkit.labs.lab11 import split_kv  # noqa: F401
from labkit.labs.lab11 import bytes_read  # noqa: F401
