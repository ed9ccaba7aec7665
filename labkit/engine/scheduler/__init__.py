"""Scheduler policies behind one interface: ``policy.schedule(state) -> SchedulerOutput``.

The contract is :class:`labkit.engine.interfaces.SchedulerPolicy`; this package holds labkit's policies, their
base :class:`PolicyBase`, and (for a learner's policy) the state it plans with, from :mod:`labkit.engine.state`.
"""

from labkit.engine.interfaces import SchedulerPolicy, require
from labkit.engine.scheduler.base import PolicyBase, schedule_running
from labkit.engine.scheduler.chunked import ChunkedPrefill
from labkit.engine.scheduler.continuous import ContinuousBatching
from labkit.engine.scheduler.function import FunctionPolicy, policy_from_function
from labkit.engine.scheduler.static import StaticBatching
from labkit.engine.state import (
    CHUNKED_TOKEN_BUDGET,
    UNCHUNKED_TOKEN_BUDGET,
    SchedulerOutput,
    SchedulerState,
    newest,
    token_budget,
)

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
    "PolicyBase",
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
