"""Lab 1, prefill and decode: its four exercises' checks, a module each (importing this package registers them);
the later ones graded on the course's own earlier pieces (``on_its_own``), so one mistake costs one point."""

from __future__ import annotations

# the exercises number in the order their modules are imported: the notebook's
# isort: off
from labkit.labs.lab1.mask import course_causal_mask
from labkit.labs.lab1 import attention  # noqa: F401
from labkit.labs.lab1 import prefill  # noqa: F401
from labkit.labs.lab1 import generate  # noqa: F401
# isort: on

__all__ = ["course_causal_mask"]
