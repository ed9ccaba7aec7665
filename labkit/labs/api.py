"""What lab notebooks import from labkit.labs: one stable surface, so a notebook already handed out keeps
working when the grader's own modules (:mod:`labkit.labs.common`, :mod:`labkit.labs.aids`) change.

A notebook writes ``from labkit.labs.api import passed, course_model`` (and ``from labkit.labs import labN``
to register its checks); nothing else of ``labkit.labs``, which a test holds. Each name is imported only
when a notebook asks for it, so lab 1 does not load lab 9's server.
"""

from __future__ import annotations

import importlib

# name -> the module that defines it (kept here, not star-imported, so the surface is plain to read)
_WHERE = {
    # every lab
    "passed": "labkit.labs.common.gate",
    "course_model": "labkit.labs.common.shared",
    "small_model": "labkit.labs.common.shared",
    "PROMPTS": "labkit.labs.common.shared",
    # measuring this machine (labs 1-2), the capacity sliders (lab 2), the padded cache (lab 3)
    "measure_roofline": "labkit.labs.aids.measure",
    "median_seconds": "labkit.labs.aids.measure",
    "tokens_per_second_vs_batch": "labkit.labs.aids.measure",
    "capacity_table": "labkit.labs.aids.capacity_widget",
    "conversations_widget": "labkit.labs.aids.capacity_widget",
    "PaddedBatchCache": "labkit.labs.aids.padded_cache",
    "RecordingModel": "labkit.labs.common.recording",
    # runs of the engine with a learner's piece plugged in (labs 4-9)
    "TickClock": "labkit.labs.common.engine_runs",
    "random_requests": "labkit.labs.common.engine_runs",
    "run_requests": "labkit.labs.common.engine_runs",
    "policy_from_function": "labkit.engine.scheduler",
    "allocator_with": "labkit.labs.lab7.runs",
    "shared_block_snapshot": "labkit.labs.lab7.runs",
    # lab 9's server under load
    "LOAD": "labkit.labs.lab9.load",
    "RATES": "labkit.labs.lab9.load",
    "SERVER_DIALS": "labkit.labs.lab9.load",
    "promise_for": "labkit.labs.lab9.load",
    "parse_metrics": "labkit.labs.lab9.scrape",
    # lab 10: a model whose weights went through a learner's quantize-then-dequantize
    "model_with_weights": "labkit.labs.lab10.runs",
    # lab 12: multi-turn chats replayed on two replicas, one routing policy at a time
    "chat_replay": "labkit.labs.lab12.replay",
    "compare_policies": "labkit.labs.lab12.replay",
    "PolicyTable": "labkit.labs.lab12.replay",
    "routing_policies": "labkit.labs.lab12.replay",
    # lab 12: the tier and the hand-off run with the learner's functions
    "measure_tier_costs": "labkit.labs.lab12.runs",
    "tier_off_and_on": "labkit.labs.lab12.runs",
    "apart_and_together": "labkit.labs.lab12.runs",
    # lab 13: this machine's kernels probed row by row, one query in four places, the engine alone and in a crowd
    "this_machines_operations": "labkit.labs.lab13.runs",
    "split_partial": "labkit.labs.lab13.kernels",
    "one_query_in_four_places": "labkit.labs.lab13.runs",
    "alone_and_in_a_crowd": "labkit.labs.lab13.runs",
    "cost_of_determinism": "labkit.labs.lab13.runs",
    # lab 14: the small mixture, one and two processes side by side, the bytes a step reads against the planner's
    "make_layer": "labkit.labs.lab14.moe_model",
    "per_token_reference": "labkit.labs.lab14.moe_model",
    "one_and_two_processes": "labkit.labs.lab14.runs",
    "bytes_per_step_curve": "labkit.labs.lab14.runs",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    """Import ``name`` from its module the first time a notebook asks for it."""
    if name not in _WHERE:
        raise AttributeError(f"labkit.labs.api has no {name!r}; the names it offers are {', '.join(__all__)}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
