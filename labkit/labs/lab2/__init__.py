"""Lab 2, the KV cache: its four exercises' checks, a module each (importing this package registers them)."""

from __future__ import annotations

# the exercises number in the order their modules are imported: the notebook's
# isort: off
from labkit.labs.lab2 import cache  # noqa: F401
from labkit.labs.lab2 import generate  # noqa: F401
from labkit.labs.lab2 import bytes_per_token  # noqa: F401
from labkit.labs.lab2 import conversations  # noqa: F401
# isort: on
