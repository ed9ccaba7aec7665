"""Lab 11, the kernel: PagedAttention's decode step as a GPU runs it, written in Triton and checked on any CPU.

The checks of its three exercises, a module each (importing this package registers all three, in the order the
notebook shows them). Both kernel checks grade kernels, not only outputs: the exercise cell's source, read as data,
must hold Triton kernels only, and they must compile for an H100 (:mod:`~labkit.labs.lab11.compiled`).
"""

# the exercises register in the order the notebook shows them, not sorted
from labkit.labs.lab11 import paged_decode  # noqa: F401, I001
from labkit.labs.lab11 import split_kv  # noqa: F401
from labkit.labs.lab11 import bytes_read  # noqa: F401
