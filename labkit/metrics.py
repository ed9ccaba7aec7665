"""Serving metrics from a run's :class:`~labkit.trace.Trace`, defined as vLLM's ``bench serve`` defines them.

Using the same definitions means a learner's numbers from labkit (or the simulator)
mean what the same names mean at work:

- **TTFT**: first token time minus arrival time (queueing plus prefill).
- **TPOT**: time per output token *after the first*: ``(e2e - ttft) / (output_len - 1)``,
  only for requests with more than one output token.
- **ITL**: every gap between consecutive tokens of a request, pooled over all requests.
- **E2EL**: finish time minus arrival time.
- **Throughput**: completed requests, output tokens, and prompt + output tokens per
  second of the run, which lasts from the first arrival to the last finish.
- **Prefix cache**: ``prefix_cache_queries`` (prompt tokens of admitted requests, counted
  again when a preempted request is readmitted) and ``prefix_cache_hits`` (those found in
  the cache, not computed), summed over the steps; their ratio is the hit rate.
- **Speculative decoding** (vLLM's names): ``spec_decode_num_drafts`` (request-steps that
  verified drafts), ``spec_decode_num_draft_tokens`` and ``spec_decode_num_accepted_tokens``,
  summed over the steps. The acceptance rate is accepted / draft tokens; the mean acceptance
  length is 1 + accepted / drafts: tokens a speculating request gains per step, its own
  target token included (1.0 means speculation never helped).
- **Goodput**: completed requests per second that met *every* limit of an SLO given in
  milliseconds, like ``--goodput ttft:500 tpot:50``. As in vLLM, a request with a
  single output token counts as TPOT 0 here.

Latency statistics cover completed requests only. Rejected and unfinished requests
are counted and named separately, never averaged in silently. Slot utilisation and
padding come from the steps: a slot held by a sequence that computed nothing this
step (static batching keeps finished sequences in the batch) is a padded slot-step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from labkit.trace import RequestRecord, Trace

SLO_METRICS = ("ttft", "tpot", "e2el")


@dataclass(frozen=True, eq=False)
class Distribution:
    """Mean, median, p90, p99 and standard deviation of one metric, in milliseconds."""

    values: np.ndarray = field(repr=False)  # every sample, in ms

    @property
    def count(self) -> int:
        return len(self.values)

    def percentile(self, q: float) -> float:
        """The q-th percentile (0-100) with numpy's linear interpolation; NaN if there are no samples."""
        return float(np.percentile(self.values, q)) if self.count else math.nan

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.count else math.nan

    @property
    def median(self) -> float:
        return self.percentile(50)

    @property
    def p90(self) -> float:
        return self.percentile(90)

    @property
    def p99(self) -> float:
        return self.percentile(99)

    @property
    def std(self) -> float:
        """Population standard deviation (numpy's default, as vLLM reports it)."""
        return float(np.std(self.values)) if self.count else math.nan


def _ms(seconds: Iterable[float]) -> Distribution:
    return Distribution(np.fromiter(seconds, dtype=float) * 1000.0)


def parse_slo(slo: str | Iterable[str] | Mapping[str, float]) -> dict[str, float]:
    """Read an SLO like ``"ttft:500 tpot:50"`` (limits in ms) into ``{"ttft": 500.0, "tpot": 50.0}``.

    Accepts the string, a list of ``"name:ms"`` items (as argparse gives them), or a
    mapping. Names are ttft, tpot and e2el; each limit must be a positive number.
    """
    if isinstance(slo, Mapping):
        items = [(str(name), value) for name, value in slo.items()]
    else:
        parts = slo.split() if isinstance(slo, str) else [p for item in slo for p in str(item).split()]
        items = []
        for part in parts:
            name, sep, value = part.partition(":")
            if not sep:
                raise ValueError(
                    f"SLO item {part!r} has no ':'; write it as name:milliseconds, for example 'ttft:500 tpot:50'"
                )
            items.append((name, value))
    if not items:
        raise ValueError("the SLO is empty; give at least one limit, for example 'ttft:500 tpot:50'")
    limits: dict[str, float] = {}
    for name, value in items:
        name = name.strip().lower()
        if name not in SLO_METRICS:
            raise ValueError(
                f"unknown SLO metric {name!r}; use one of {', '.join(SLO_METRICS)} "
                f"(limits in ms, for example 'ttft:500 tpot:50')"
            )
        if name in limits:
            raise ValueError(f"SLO metric {name!r} is given twice; give each limit once")
        try:
            limit = float(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"SLO limit for {name!r} is {value!r}, not a number; write milliseconds, for example '{name}:500'"
            ) from None
        if not math.isfinite(limit) or limit <= 0:
            raise ValueError(f"SLO limit for {name!r} must be a positive number of ms, got {value!r}")
        limits[name] = limit
    return limits


@dataclass
class Summary:
    """Everything :func:`summarize` measures about one run. Latencies are in ms."""

    num_requests: int
    num_completed: int
    rejected_ids: list[str]
    unfinished_ids: list[str]
    duration_s: float  # first arrival to last finish (or last step, if requests were left unfinished)
    total_input_tokens: int  # of completed requests, as vLLM counts them
    total_output_tokens: int
    request_throughput: float  # completed requests / s
    output_throughput: float  # output tokens / s
    total_token_throughput: float  # (prompt + output) tokens / s
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    e2el_ms: Distribution
    queue_ms: Distribution  # first scheduled - arrival
    num_preemptions: int
    num_steps: int
    slot_utilization: float  # sum of active sequences / sum of slots held, over steps
    padded_slot_steps: int  # sum of (slots held - active sequences), over steps
    mean_batch_size: float  # active sequences per step
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache, over the steps
    prefix_cache_hits: int = 0  # ... of which found there
    spec_decode_num_drafts: int = 0  # request-steps that verified draft tokens
    spec_decode_num_draft_tokens: int = 0  # draft tokens verified
    spec_decode_num_accepted_tokens: int = 0  # ... of which accepted
    slo: dict[str, float] | None = None
    num_good: int | None = None  # completed requests meeting every SLO limit
    goodput: float | None = None  # good requests / s

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Share of looked-up prompt tokens found in the prefix cache; NaN with caching off."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else math.nan

    @property
    def spec_decode_acceptance_rate(self) -> float:
        """Share of draft tokens the target accepted; NaN without speculation."""
        drafted = self.spec_decode_num_draft_tokens
        return self.spec_decode_num_accepted_tokens / drafted if drafted else math.nan

    @property
    def spec_decode_mean_acceptance_length(self) -> float:
        """Tokens per speculating request-step: 1 (the target's own) + accepted drafts per step; NaN without."""
        drafts = self.spec_decode_num_drafts
        return 1 + self.spec_decode_num_accepted_tokens / drafts if drafts else math.nan

    @property
    def num_rejected(self) -> int:
        return len(self.rejected_ids)

    @property
    def num_unfinished(self) -> int:
        return len(self.unfinished_ids)

    def to_dict(self) -> dict[str, float | int | None]:
        """Flat numbers under vLLM ``bench serve``'s result names (mean_ttft_ms, p99_tpot_ms, ...)."""
        out: dict[str, float | int | None] = {
            "num_requests": self.num_requests,
            "completed": self.num_completed,
            "rejected": self.num_rejected,
            "unfinished": self.num_unfinished,
            "duration": self.duration_s,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "request_goodput": self.goodput,
            "num_preemptions": self.num_preemptions,
            "num_steps": self.num_steps,
            "slot_utilization": self.slot_utilization,
            "padded_slot_steps": self.padded_slot_steps,
            "mean_batch_size": self.mean_batch_size,
            "prefix_cache_queries": self.prefix_cache_queries,
            "prefix_cache_hits": self.prefix_cache_hits,
            "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
            "spec_decode_num_drafts": self.spec_decode_num_drafts,
            "spec_decode_num_draft_tokens": self.spec_decode_num_draft_tokens,
            "spec_decode_num_accepted_tokens": self.spec_decode_num_accepted_tokens,
            "spec_decode_acceptance_rate": self.spec_decode_acceptance_rate,
            "spec_decode_mean_acceptance_length": self.spec_decode_mean_acceptance_length,
        }
        for name, dist in self.distributions().items():
            out[f"mean_{name}_ms"] = dist.mean
            out[f"median_{name}_ms"] = dist.median
            out[f"std_{name}_ms"] = dist.std
            out[f"p90_{name}_ms"] = dist.p90
            out[f"p99_{name}_ms"] = dist.p99
        return out

    def distributions(self) -> dict[str, Distribution]:
        """The latency distributions by short name: ttft, tpot, itl, e2el, queue."""
        return {
            "ttft": self.ttft_ms,
            "tpot": self.tpot_ms,
            "itl": self.itl_ms,
            "e2el": self.e2el_ms,
            "queue": self.queue_ms,
        }


def _is_rejected(record: RequestRecord) -> bool:
    return record.finish_reason == "rejected"


def _tpot(record: RequestRecord) -> float | None:
    """Seconds per output token after the first; None for a single-token answer."""
    if record.output_len < 2:
        return None
    return (record.finish_time - record.first_token_time) / (record.output_len - 1)


def _token_gaps(records: list[RequestRecord]) -> np.ndarray:
    """Seconds between consecutive tokens of each request, pooled over all requests (ITL)."""
    gaps = [np.diff(r.token_times) for r in records if r.output_len > 1]
    return np.concatenate(gaps) if gaps else np.empty(0)


def _meets(record: RequestRecord, slo: dict[str, float]) -> bool:
    measured_ms = {
        "ttft": (record.first_token_time - record.arrival_time) * 1000.0,
        "tpot": (_tpot(record) or 0.0) * 1000.0,  # vLLM counts a one-token answer as TPOT 0
        "e2el": (record.finish_time - record.arrival_time) * 1000.0,
    }
    return all(measured_ms[name] <= limit for name, limit in slo.items())


def _run_duration(trace: Trace) -> float:
    """Seconds from the first arrival to the last finish (or the last step, if later)."""
    start = min(r.arrival_time for r in trace.requests)
    ends = [r.finish_time for r in trace.requests if r.finish_time is not None]
    ends += [s.end for s in trace.steps]
    return max(ends, default=start) - start


def summarize(trace: Trace, slo: str | Iterable[str] | Mapping[str, float] | None = None) -> Summary:
    """Measure one run: latencies, throughput, goodput under ``slo`` (see :func:`parse_slo`), batching."""
    if not trace.requests:
        raise ValueError("the trace has no requests; run the engine or the simulator on a workload first")
    limits = parse_slo(slo) if slo is not None else None
    rejected = [r for r in trace.requests if _is_rejected(r)]
    unfinished = [r for r in trace.requests if r.finish_time is None and not _is_rejected(r)]
    done = [r for r in trace.requests if r.finish_time is not None and not _is_rejected(r)]
    answered = [r for r in done if r.token_times]

    duration = _run_duration(trace)
    input_tokens = sum(r.prompt_len for r in done)
    output_tokens = sum(r.output_len for r in done)

    def per_second(count: float) -> float:
        return count / duration if duration > 0 else math.nan

    slots_held = sum(s.slots_held for s in trace.steps)
    active = sum(s.num_active for s in trace.steps)
    num_good = sum(_meets(r, limits) for r in answered) if limits else None
    return Summary(
        num_requests=len(trace.requests),
        num_completed=len(done),
        rejected_ids=[r.request_id for r in rejected],
        unfinished_ids=[r.request_id for r in unfinished],
        duration_s=duration,
        total_input_tokens=input_tokens,
        total_output_tokens=output_tokens,
        request_throughput=per_second(len(done)),
        output_throughput=per_second(output_tokens),
        total_token_throughput=per_second(input_tokens + output_tokens),
        ttft_ms=_ms(r.first_token_time - r.arrival_time for r in answered),
        tpot_ms=_ms(t for t in map(_tpot, done) if t is not None),
        itl_ms=Distribution(_token_gaps(done) * 1000.0),
        e2el_ms=_ms(r.finish_time - r.arrival_time for r in done),
        queue_ms=_ms(r.first_scheduled_time - r.arrival_time for r in done if r.first_scheduled_time is not None),
        num_preemptions=sum(r.num_preemptions for r in trace.requests),
        num_steps=len(trace.steps),
        slot_utilization=active / slots_held if slots_held else math.nan,
        padded_slot_steps=slots_held - active,
        mean_batch_size=active / len(trace.steps) if trace.steps else math.nan,
        prefix_cache_queries=sum(s.prefix_cache_queries for s in trace.steps),
        prefix_cache_hits=sum(s.prefix_cache_hits for s in trace.steps),
        spec_decode_num_drafts=sum(s.num_drafts for s in trace.steps),
        spec_decode_num_draft_tokens=sum(s.num_draft_tokens for s in trace.steps),
        spec_decode_num_accepted_tokens=sum(s.num_accepted_tokens for s in trace.steps),
        slo=limits,
        num_good=num_good,
        goodput=per_second(num_good) if limits else None,
    )
