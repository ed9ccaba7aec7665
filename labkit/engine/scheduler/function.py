"""A scheduling function as a policy: how a learner's ``schedule(state) -> SchedulerOutput`` plugs into the engine."""

from __future__ import annotations

from collections.abc import Callable

from labkit.engine.scheduler.base import PolicyBase
from labkit.engine.state import SchedulerOutput, SchedulerState


class FunctionPolicy(PolicyBase):
    """A policy that calls ``schedule_fn(state)`` each step and refuses a plan that is not a SchedulerOutput.

    ``chunked`` tells the engine whether the function cuts prompts into chunks (then the token
    budget may be below max_model_len).
    """

    def __init__(
        self, schedule_fn: Callable[[SchedulerState], SchedulerOutput], name: str = "yours", chunked: bool = False
    ):
        self.schedule_fn = schedule_fn
        self.name = name
        self.chunked = chunked

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        plan = self.schedule_fn(state)
        if not isinstance(plan, SchedulerOutput):
            raise TypeError(f"the scheduling function returned a {type(plan).__name__}; return a SchedulerOutput")
        return plan


def policy_from_function(
    schedule_fn: Callable[[SchedulerState], SchedulerOutput], chunked: bool = False, name: str = "yours"
) -> FunctionPolicy:
    """Wrap a learner's ``schedule(state) -> SchedulerOutput`` so the engine can use it as its policy."""
    if not callable(schedule_fn):
        raise TypeError(f"expected your scheduling function, got {type(schedule_fn).__name__}")
    return FunctionPolicy(schedule_fn, name, chunked)
