"""Lab 2, the KV cache: the checks for its four exercises, a module each (importing this package registers all four).

The learner writes a per-sequence cache that appends each pass's K and V and attends over all of it
(:mod:`~labkit.labs.lab2.cache`), decoding that feeds one token per step through it
(:mod:`~labkit.labs.lab2.generate`), the KV bytes a token leaves behind (:mod:`~labkit.labs.lab2.bytes_per_token`),
and how many conversations fit in a GPU's memory (:mod:`~labkit.labs.lab2.conversations`). The oracle for decoding
is the run without a cache, through Hugging Face transformers' own forward pass, compared at every step.
"""

from __future__ import annotations

# the exercises number in the order their modules are imported: the notebook's
# isort: off
from labkit.labs.lab2 import cache  # noqa: F401
from labkit.labs.lab2 import generate  # noqa: F401
from labkit.labs.lab2 import bytes_per_token  # noqa: F401
from labkit.labs.lab2 import conversations  # noqa: F401
# isort: on
