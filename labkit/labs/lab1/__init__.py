"""Lab 1, prefill and decode: the checks for its four exercises, a module each (importing this package registers all four).

The learner writes a causal mask (:mod:`~labkit.labs.lab1.mask`), attention with grouped-query heads
(:mod:`~labkit.labs.lab1.attention`), a prefill that runs the whole prompt through ``model.forward`` in one pass
(:mod:`~labkit.labs.lab1.prefill`), and a decode loop without a cache that reruns the whole sequence for every new
token (:mod:`~labkit.labs.lab1.generate`). The oracles are the math (for the mask and attention) and Hugging Face
transformers' own forward pass (for prefill and decoding). Prefill and decoding are graded on the course's own
mask, attention and prefill (``on_its_own``), so one mistake costs one point; the learner's own earlier pieces are
checked on the side.
"""

from __future__ import annotations

# the exercises number in the order their modules are imported: the notebook's
# isort: off
from labkit.labs.lab1.mask import course_causal_mask
from labkit.labs.lab1 import attention  # noqa: F401
from labkit.labs.lab1 import prefill  # noqa: F401
from labkit.labs.lab1 import generate  # noqa: F401
# isort: on

__all__ = ["course_causal_mask"]
