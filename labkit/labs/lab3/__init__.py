"""Lab 3, static batching: its four exercises' checks, a module each (importing this package registers them)."""

from __future__ import annotations

# the exercises number in the order their modules are imported: the notebook's
# isort: off
from labkit.labs.lab3.left_pad import padded_layout
from labkit.labs.lab3.mask import course_padded_causal_mask
from labkit.labs.lab3 import static_batch  # noqa: F401
from labkit.labs.lab3.waste import _waste
# isort: on

# the course's answers, by the names the exercises declare them under (labkit.labs.lab3.padded_layout, ...)
__all__ = ["_waste", "course_padded_causal_mask", "padded_layout"]
