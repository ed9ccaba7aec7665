"""Scheduler policies behind one interface: ``policy.schedule(state) -> SchedulerOutput``."""

from labkit.engine.interfaces import require
from labkit.engine.scheduler.base import (
    CHUNKED_TOKEN_BUDGET,
    UNCHUNKED_TOKEN_BUDGET,
    SchedulerOutput,
    SchedulerPolicy,
    SchedulerState,
    newest,
    schedule_running,
    token_budget,
)
from labkit.engine.scheduler.chunked import ChunkedPrefill
from labkit.engine.scheduler.continuous import ContinuousBatching
from labkit.engine.scheduler.function import FunctionPolicy, policy_from_function
from labkit.engine.scheduler.static import StaticBatching

POLICIES = {"static": StaticBatching, "continuous": ContinuousBatching, "chunked": ChunkedPrefill}


def make_policy(policy: "str | SchedulerPolicy") -> SchedulerPolicy:
    """A policy object from its name ('static', 'continuous', 'chunked'), or your own object, checked
    against :class:`labkit.engine.interfaces.SchedulerPolicy` (a subclass of ours or not)."""
    if not isinstance(policy, str):
        require(policy, "chunked prefill" if getattr(policy, "chunked", False) else "scheduling")
        return policy
    if policy not in POLICIES:
        raise ValueError(
            f"unknown scheduler policy {policy!r}; use one of {sorted(POLICIES)} or pass a SchedulerPolicy instance"
        )
    return POLICIES[policy]()


__all__ = [
    "CHUNKED_TOKEN_BUDGET",
    "UNCHUNKED_TOKEN_BUDGET",
    "token_budget",
    "SchedulerOutput",
    "SchedulerPolicy",
    "SchedulerState",
    "newest",
    "schedule_running",
    "StaticBatching",
    "ContinuousBatching",
    "ChunkedPrefill",
    "FunctionPolicy",
    "policy_from_function",
    "POLICIES",
    "make_policy",
]
