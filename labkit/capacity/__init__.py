"""Napkin capacity planning (``labkit plan``): how many users one GPU serves, and what a million tokens costs.

- :mod:`~labkit.capacity.planner`: :func:`plan` and its :class:`CapacityPlan`, the load that keeps
  a promise, the planner's models and their precisions;
- :mod:`~labkit.capacity.parallel`: one model split over the GPUs of a node, and its all-reduces;
- :mod:`~labkit.capacity.fleet`: :func:`size_fleet`, the fewest GPUs that carry a load;
- :mod:`~labkit.capacity.presets`: the course's worked examples (``plan(**SALE_EXAMPLE)``);
- :mod:`~labkit.capacity.report`: the text tables ``str()`` of a plan or a fleet prints.

Plain Python: none of it loads torch. The speculation figures of ``labkit plan --speculate`` are
:mod:`labkit.sim.speculation`'s, importable from here too.
"""

from labkit.capacity.fleet import FleetOption, FleetSizing, size_fleet
from labkit.capacity.parallel import LLAMA_3_1_70B
from labkit.capacity.planner import (
    KV_BYTES,
    PLANNER_MODELS,
    WEIGHT_BYTES,
    CapacityPlan,
    load_within_promise,
    plan,
    planner_model,
    with_precision,
)
from labkit.capacity.presets import (
    FRIENDS_EXAMPLE,
    FRIENDS_GPU,
    LESSON_LLAMA_8B,
    SALE_70B_EXAMPLE,
    SALE_EXAMPLE,
    SALE_GPU,
    sale_fleet_gpu,
    sale_load,
)
from labkit.sim.cost_model import conversations_that_fit
from labkit.sim.speculation import (
    SpeculationPoint,
    format_speculation,
    speculation_breakeven_batch,
    speculative_speedup,
)

__all__ = [
    "FRIENDS_EXAMPLE",
    "FRIENDS_GPU",
    "KV_BYTES",
    "LESSON_LLAMA_8B",
    "LLAMA_3_1_70B",
    "PLANNER_MODELS",
    "SALE_70B_EXAMPLE",
    "SALE_EXAMPLE",
    "SALE_GPU",
    "WEIGHT_BYTES",
    "CapacityPlan",
    "FleetOption",
    "FleetSizing",
    "SpeculationPoint",
    "conversations_that_fit",
    "format_speculation",
    "load_within_promise",
    "plan",
    "planner_model",
    "sale_fleet_gpu",
    "sale_load",
    "size_fleet",
    "speculation_breakeven_batch",
    "speculative_speedup",
    "with_precision",
]
