"""One rule for "the highest request rate that keeps the promise", shared by the load tester, the simulator and
lab 9's checks, so that a sweep measured, simulated or graded is judged the same way.

A promise (a service level objective) is about the slow users, not the average one: p99 time
per output token within a limit, optionally p99 time to first token within another, and nothing
lost (a request the server refused or broke off breaks any promise). The rate to sign is the
highest one below the first (lowest) rate that breaks it: a rate that passes again above a
failure is noise, not capacity, since the promise has to hold at every load up to the one signed.

The rule reads a :class:`RateResult`, three numbers per rate. The simulator's
:class:`~labkit.sim.serving.RatePrediction` has them as they are; :func:`from_summary` takes them
from a load test's :class:`~labkit.metrics.Summary` (``labkit loadtest``), :func:`from_requests`
from the per-request dicts :func:`labkit.serve.background.measure` returns (lab 9).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from labkit.metrics import Summary

LIMIT_NAMES = ("ttft_ms", "tpot_ms")  # the keys of a promise written as a dict, as lab 9 passes it


@dataclass(frozen=True)
class Promise:
    """p99 TPOT within ``tpot_ms``, p99 TTFT within ``ttft_ms`` if given, and no request lost."""

    tpot_ms: float
    ttft_ms: float | None = None

    def __post_init__(self) -> None:
        for name in LIMIT_NAMES:
            limit = getattr(self, name)
            if limit is None and name == "ttft_ms":
                continue
            if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:
                raise ValueError(f"the promise's {name} limit must be a positive number of ms, got {limit!r}")

    @classmethod
    def from_limits(cls, limits: Mapping[str, float]) -> Promise:
        """The promise written as lab 9 writes it, ``{"ttft_ms": 1000, "tpot_ms": 100}`` (TTFT optional)."""
        unknown = sorted(set(limits) - set(LIMIT_NAMES))
        if unknown or "tpot_ms" not in limits:
            raise ValueError(
                f"a promise needs a 'tpot_ms' limit and may have a 'ttft_ms' one (p99s in ms); got {dict(limits)!r}"
            )
        return cls(tpot_ms=limits["tpot_ms"], ttft_ms=limits.get("ttft_ms"))

    def describe(self) -> str:
        """The promise in words, for tables and messages."""
        ttft = "" if self.ttft_ms is None else f"p99 TTFT <= {self.ttft_ms:g} ms, "
        return f"{ttft}p99 TPOT <= {self.tpot_ms:g} ms and nothing lost"


class RateResult(Protocol):
    """What the rule needs to know of one rate's run (latencies in ms)."""

    @property
    def p99_ttft_ms(self) -> float: ...

    @property
    def p99_tpot_ms(self) -> float: ...

    @property
    def lost(self) -> int: ...


@dataclass(frozen=True)
class Measured:
    """A measured rate's :class:`RateResult`; a p99 is NaN when no request was served."""

    p99_ttft_ms: float
    p99_tpot_ms: float
    lost: int


def from_summary(summary: Summary) -> Measured:
    """A load test's summary (``labkit loadtest``) as the rule reads it."""
    return Measured(summary.ttft_ms.p99, summary.tpot_ms.p99, summary.num_requests - summary.num_completed)


def from_requests(requests: Sequence[Mapping[str, Any]]) -> Measured:
    """One dict per request, ``{"ok", "ttft_ms", "tpot_ms", ...}`` as ``measure`` returns them, as the rule reads it."""
    served = [request for request in requests if request["ok"]]

    def p99(metric: str) -> float:
        return float(np.percentile([request[metric] for request in served], 99)) if served else math.nan

    return Measured(p99("ttft_ms"), p99("tpot_ms"), len(requests) - len(served))


def keeps(result: RateResult, promise: Promise) -> bool:
    """Whether one rate's run kept the promise: nothing lost and every p99 within its limit (NaN never is)."""
    ttft_kept = promise.ttft_ms is None or result.p99_ttft_ms <= promise.ttft_ms
    return result.lost == 0 and result.p99_tpot_ms <= promise.tpot_ms and ttft_kept


def highest_rate(results_by_rate: Mapping[float, RateResult], promise: Promise) -> float | None:
    """The highest rate below the first (lowest) rate that breaks the promise; None if the lowest breaks it."""
    best = None
    for rate in sorted(results_by_rate):
        if not keeps(results_by_rate[rate], promise):
            break
        best = rate
    return best
