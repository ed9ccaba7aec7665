"""Lab 3, static batching: the checks for its four exercises, a module each (importing this package registers all four).

The learner lays prompts of different lengths out as one rectangle (left padding, positions counted from each
prompt's first real token: :mod:`~labkit.labs.lab3.left_pad`), writes the mask that hides pads and the future
(:mod:`~labkit.labs.lab3.mask`), decodes the whole batch until its longest member ends
(:mod:`~labkit.labs.lab3.static_batch`), and counts the slot-steps lost to padding (:mod:`~labkit.labs.lab3.waste`).
The oracle for the batch is each prompt decoded alone, greedily, with labkit's cache. The batch is graded on the
course's own left_pad and mask (``on_its_own``), so one mistake costs one point; the learner's own are checked on
the side.
"""

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
