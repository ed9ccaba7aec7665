"""What a fleet's run leaves, whichever clock drove it: each replica's trace and where every request went, so one
table of hit rates and latencies reads the simulator's fleet and real engines behind a router alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from labkit.metrics import Summary, summarize
from labkit.trace import RequestRecord, Trace


@dataclass(frozen=True)
class FleetRequest:
    """What one request's user saw, and where it was served (times in seconds; None where there is none)."""

    request_id: str
    replica: int
    ttft_s: float | None  # first token - arrival
    tpot_s: float | None  # (finish - first token) / (tokens - 1), for answers of two tokens or more
    finish_time: float | None
    finish_reason: str | None


@dataclass
class FleetRun:
    """A fleet's run: each replica's trace (the shape :func:`~labkit.sim.simulator.simulate` returns) and the routing."""

    traces: list[Trace]  # one per replica, in replica order
    replica_of: dict[str, int]  # request id -> the replica it was sent to, in order of arrival
    router: str

    @property
    def replicas(self) -> int:
        return len(self.traces)

    @property
    def trace(self) -> Trace:
        """Every replica's requests (in order of arrival) and steps (by start time) in one trace, for fleet metrics."""
        records = {record.request_id: record for trace in self.traces for record in trace.requests}
        steps = sorted((step for trace in self.traces for step in trace.steps), key=lambda step: step.start)
        meta = dict(self.traces[0].meta, replicas=self.replicas, router=self.router)
        return Trace(requests=[records[request_id] for request_id in self.replica_of], steps=steps, meta=meta)

    def summary(self, slo: str | Iterable[str] | Mapping[str, float] | None = None) -> Summary:
        """The fleet's :func:`~labkit.metrics.summarize`: p99s over every request, whichever replica served it."""
        return summarize(self.trace, slo)

    def replica_summaries(self) -> list[Summary | None]:
        """Each replica's own summary; None for a replica the router sent nothing."""
        return [summarize(trace) if trace.requests else None for trace in self.traces]

    def requests(self) -> list[FleetRequest]:
        """One row per request, in order of arrival: its replica, TTFT, TPOT and finish."""
        records = {record.request_id: record for trace in self.traces for record in trace.requests}
        return [_row(records[request_id], replica) for request_id, replica in self.replica_of.items()]


def _row(record: RequestRecord, replica: int) -> FleetRequest:
    first = record.first_token_time
    tpot = None
    if record.output_len > 1 and record.finish_time is not None and first is not None:
        tpot = (record.finish_time - first) / (record.output_len - 1)
    return FleetRequest(
        record.request_id,
        replica,
        None if first is None else first - record.arrival_time,
        tpot,
        record.finish_time,
        record.finish_reason,
    )
