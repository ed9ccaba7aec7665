"""Lab 10, fewer bytes and more GPUs: the checks for the learner's quantizers, quality run and fleet search.

Four exercises, each checked in its own module (importing this package registers all four checks, in the order
the notebook shows them):

- ``quantize_int8(weight) -> (codes, scale)`` and ``dequantize_int8(codes, scale)`` (``lab10.int8``,
  :mod:`~labkit.labs.lab10.int8`): symmetric int8, one scale per output row.
- ``quantize_int4(weight, group_size) -> (codes, scale, zero)`` and ``dequantize_int4(...)`` (``lab10.int4``,
  :mod:`~labkit.labs.lab10.int4`): 4-bit codes in groups of ``group_size`` columns, a scale and a zero point per
  group.
- ``measure_quality(model, round_trips, prompts, n_tokens)`` (``lab10.quality``, :mod:`~labkit.labs.lab10.quality`):
  each scheme's model built and judged with labkit's ``quality``.
- ``fewest_gpus(load_per_s, inputs) -> (tensor_parallel, replicas)`` (``lab10.fleet``,
  :mod:`~labkit.labs.lab10.fleet`): the search over splits and replicas with labkit's planner.

Both quantizer checks compare with :mod:`labkit.models.quant` through the adapters of
:mod:`labkit.labs.lab10.course`, and judge the learner's numbers by the rules of
:mod:`labkit.labs.lab10.quantizers`; the notebook builds its models with :mod:`labkit.labs.lab10.runs`.
"""

# the exercises register in the order the notebook shows them, not sorted
from labkit.labs.lab10 import int8  # noqa: F401, I001
from labkit.labs.lab10 import int4  # noqa: F401
from labkit.labs.lab10 import quality  # noqa: F401
from labkit.labs.lab10.fleet import EXACT_MULTIPLES

__all__ = ["EXACT_MULTIPLES"]
