"""Prefill and decode on separate GPU pools, with each request's KV cache crossing a link between them, against the
same GPUs running chunked prefill: where splitting the phases wins the sale's 50 ms promise back, and where not.

Why: on a colocated GPU every decode step that carries a prompt chunk lasts as long as that chunk's arithmetic, so
while long prompts arrive the gap between a user's tokens grows past the promise (the lesson's "15% of the capacity").
Disaggregated serving (DistServe, Splitwise; vLLM's KV connectors) prefills on one pool and decodes on another, so
decode steps carry no chunks; the price is a KV transfer per request and GPUs split by phase, each pool idle when its
phase is not needed. vLLM's documentation says it plainly: disaggregated prefill does not improve throughput; it
controls tail latency. The table of :func:`disaggregation_table` shows both.

The pools are the simulator's own engines (:func:`~labkit.sim.simulator.simulated_core`) in the engine's one event
loop (:meth:`~labkit.engine.fleet.Fleet.serve` of the prefill pool, with the decode pool and the KV on its way there
as one more event source): arrivals are routed to the prefill pool; a request whose first token
is out is handed over (:meth:`~labkit.engine.core.EngineCore.hand_over`, the real engine's call), crosses its prefill
GPU's link (one transfer at a time per GPU: latency plus KV bytes over bandwidth, KV bytes from the model's bytes per
token) and joins the decode GPU with the fewest running requests that has a seat and blocks for it
(:meth:`~labkit.engine.core.EngineCore.adopt`), or waits, first come first served, until one has. As with vLLM's
disaggregated proxy, the user's stream comes from the decode side: the first token reaches the user once its KV has
landed there, so the transfer shows in the time to first token.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from labkit.engine.core import StepOutcome
from labkit.engine.fleet import Fleet, make_router
from labkit.engine.request import Request
from labkit.sim.cost_model import CostModel
from labkit.sim.fleet import FleetRun, simulate_fleet
from labkit.sim.simulator import simulated_core, workload_arrivals
from labkit.workloads import Workload, sale_workload

GB = 1e9


@dataclass(frozen=True)
class Link:
    """The link from a prefill GPU to the decode pool: ``bandwidth`` bytes/s (``math.inf``: instant) and a fixed
    ``latency_s`` per transfer."""

    bandwidth: float
    latency_s: float = 0.0
    name: str = ""

    def __post_init__(self) -> None:
        if not self.bandwidth > 0 or self.latency_s < 0:
            raise ValueError(
                f"a link needs a positive bandwidth (bytes/s, math.inf for an instant one) and a latency of 0 or "
                f"more; got bandwidth={self.bandwidth!r}, latency_s={self.latency_s!r}"
            )

    def busy_s(self, num_bytes: float) -> float:
        """Seconds the link is busy sending ``num_bytes`` (the latency comes on top, without holding it)."""
        return 0.0 if math.isinf(self.bandwidth) else num_bytes / self.bandwidth

    def describe(self) -> str:
        if self.name:
            return self.name
        if math.isinf(self.bandwidth):
            return "instant"
        return f"{self.bandwidth / GB:g} GB/s"


INSTANT = Link(math.inf, name="instant")
# Round figures for the three kinds of link a deployment meets: RDMA between nodes (400 Gb/s InfiniBand or RoCE, the
# NIXL path), an ordinary 10 Gb/s datacenter network, and a 1 Gb/s office one.
RDMA = Link(50 * GB, 10e-6, name="400 Gb/s RDMA")
ETHERNET_10G = Link(1.25 * GB, 50e-6, name="10 Gb/s Ethernet")
ETHERNET_1G = Link(0.125 * GB, 100e-6, name="1 Gb/s Ethernet")

LESSON_PROMPT_TOKENS = 1000  # the lesson's sale: 1,000-token prompts (labkit.capacity.SALE_EXAMPLE's prompt_len)


def lesson_sale(num_requests: int = 600, rate: float = 16.0, seed: int = 0) -> Workload:
    """The sale's bursty arrivals and skewed answers (:func:`~labkit.workloads.sale_workload`) with the lesson's
    1,000-token prompts, each its own (nothing shared to cache): the traffic whose prefills break the 50 ms promise."""
    sale = sale_workload(num_requests, rate, seed=seed)
    requests = [replace(r, prompt_len=LESSON_PROMPT_TOKENS, prompt=None) for r in sale]
    return replace(sale, requests=tuple(requests), name="sale, 1,000-token prompts")


class _DecodePool:
    """The decode GPUs and the KV on its way to them, as one more event source of the prefill fleet's loop: each
    prefill GPU's link sends one request at a time; a landed request waits, first come first served, for a seat."""

    def __init__(self, fleet: Fleet, link: Link, kv_bytes_per_token: float, num_links: int):
        self.fleet, self.link, self.kv_bytes_per_token = fleet, link, kv_bytes_per_token
        self.link_free = [0.0] * num_links
        self.in_flight: list[tuple[float, int, Request]] = []  # (lands at, order, request)
        self.landed: deque[Request] = deque()  # arrived at the decode pool, waiting for a seat or blocks
        self._order = itertools.count()

    def send(self, request: Request, link: int, ready: float) -> None:
        start = max(ready, self.link_free[link])
        self.link_free[link] = start + self.link.busy_s(self.kv_bytes_per_token * request.num_computed_tokens)
        heapq.heappush(self.in_flight, (self.link_free[link] + self.link.latency_s, next(self._order), request))

    @property
    def next_time(self) -> float | None:
        landing = self.in_flight[0][0] if self.in_flight else None
        return min((time for time in (self.fleet.next_step_end(), landing) if time is not None), default=None)

    def advance(self, now: float) -> None:
        """Land the KV that has crossed by ``now``; seat each landed request, first come first served, on the decode
        GPU with the fewest running requests that has room for it (its first token reaches the user now); step."""
        while self.in_flight and self.in_flight[0][0] <= now:
            self.landed.append(heapq.heappop(self.in_flight)[2])
        while self.landed:
            request, replicas = self.landed[0], self.fleet.replicas
            tokens = request.num_computed_tokens
            fits = [(len(r.core.state.running), i) for i, r in enumerate(replicas) if r.core.can_adopt(tokens)]
            if not fits and not self.fleet.has_unfinished():
                raise ValueError(
                    f"request {request.request_id!r} needs blocks for {tokens} tokens, more than an empty decode GPU "
                    "has: give the decode pool more num_blocks"
                )
            if not fits:
                break
            replica = replicas[min(fits)[1]]
            self.landed.popleft()
            replica.core.adopt(request)
            request.record.token_times[0] = now  # the stream comes from the decode side
            replica.step_end = max(replica.step_end, now)
        self.fleet.step(now)


def simulate_disaggregated(
    workload: Workload,
    cost: CostModel,
    policy: str | None = "chunked",
    *,
    prefill_gpus: int,
    decode_gpus: int,
    link: Link = INSTANT,
    router: str = "round_robin",
    **settings: Any,
) -> FleetRun:
    """Serve ``workload`` with ``prefill_gpus`` GPUs computing prompts and ``decode_gpus`` GPUs decoding, each request's
    KV crossing ``link`` in between (see the module docstring). ``cost``, ``policy`` and the settings mean what they mean
    for :func:`~labkit.sim.fleet.simulate_fleet`, for every GPU of both pools; ``router`` spreads arrivals over the
    prefill pool. Returns the run as a :class:`FleetRun` (its ``replica_of`` names the prefill GPU of each request;
    its traces are the prefill GPUs' then the decode GPUs')."""
    for name, count in (("prefill_gpus", prefill_gpus), ("decode_gpus", decode_gpus)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"{name} must be a whole number, 1 or more; got {count!r}")

    cores = [simulated_core(workload, cost, policy, **settings) for _ in range(prefill_gpus + decode_gpus)]
    prefill = Fleet(cores[:prefill_gpus], make_router(router))
    decode = _DecodePool(Fleet(cores[prefill_gpus:]), link, cost.kv_bytes_per_token, prefill_gpus)  # seats by load

    def hand_over(index: int, _: StepOutcome) -> None:
        replica = prefill.replicas[index]  # its step has ended by step_end: the KV leaves then
        for ready in replica.core.ready_to_hand_over():
            decode.send(replica.core.hand_over(ready.request_id)[0], index, replica.step_end)

    prefill.serve(workload_arrivals(workload), hand_over, decode)
    traces = [replica.core.trace for replica in prefill.replicas + decode.fleet.replicas]
    return FleetRun(
        traces, prefill.replica_of, f"{prefill_gpus} prefill + {decode_gpus} decode GPUs, {link.describe()}"
    )


Setup = tuple[int, int, Link]  # (prefill GPUs, decode GPUs, the link between them)

DEFAULT_SETUPS: tuple[Setup, ...] = (
    (2, 2, INSTANT),
    (2, 2, RDMA),
    (2, 2, ETHERNET_10G),
    (2, 2, ETHERNET_1G),
    (1, 3, RDMA),
    (3, 1, RDMA),
)


@dataclass(frozen=True)
class DisaggRow:
    """One line of :func:`disaggregation_table`: a setup at a load, and what its users saw (ms)."""

    rate: float  # requests/s
    setup: str  # "chunked (512-token steps), 4 GPUs" or "2P+2D, <link>"
    itl_p99_ms: float  # gaps between a user's tokens, p99 over every gap
    tpot_p99_ms: float
    ttft_p99_ms: float
    kept: float  # share of requests that got every token within the promise of the one before
    throughput: float  # requests/s served

    def format(self) -> str:
        return (
            f"{self.rate:>6g}  {self.setup:<30}{self.itl_p99_ms:>9.1f}{self.tpot_p99_ms:>10.1f}"
            f"{self.ttft_p99_ms:>10.0f}{self.kept:>7.0%}{self.throughput:>10.2f}"
        )


HEADER = f"{'req/s':>6}  {'setup':<30}{'ITL p99':>9}{'TPOT p99':>10}{'TTFT p99':>10}{'kept':>7}{'served/s':>10}"


def kept_share(run: FleetRun, promise_ms: float) -> float:
    """Share of the finished requests whose every token came within ``promise_ms`` of the one before ("a token at
    least every 50 ms"); a one-token answer keeps it."""
    finished = [r for r in run.trace.requests if r.finish_time is not None and r.token_times]
    kept = sum(
        all(later - earlier <= promise_ms / 1000 for earlier, later in zip(r.token_times, r.token_times[1:]))
        for r in finished
    )
    return kept / max(len(finished), 1)


def _row(rate: float, setup: str, run: FleetRun, promise_ms: float) -> DisaggRow:
    summary = run.summary()
    return DisaggRow(
        rate,
        setup,
        summary.itl_ms.p99,
        summary.tpot_ms.p99,
        summary.ttft_ms.p99,
        kept_share(run, promise_ms),
        summary.request_throughput,
    )


def disaggregation_table(
    rates=(8.0, 16.0, 24.0),
    setups: tuple[Setup, ...] = DEFAULT_SETUPS,
    chunk_budgets: tuple[int, ...] = (512, 256),
    *,
    num_requests: int = 400,
    seed: int = 0,
    cost: CostModel,
    num_blocks: int,
    promise_ms: float = 50.0,
    max_num_seqs: int = 128,
) -> list[DisaggRow]:
    """The lesson's sale (:func:`lesson_sale`) at each rate on the same number of GPUs: all of them running chunked
    prefill behind a round-robin router (one row per step budget ``max_num_batched_tokens`` in ``chunk_budgets``),
    then each (prefill GPUs, decode GPUs, link) setup, whose GPUs run the first budget. Each GPU has ``cost`` and
    ``num_blocks`` (the lesson's: its 8B model on its A100-class GPU with 3 ms per pass, see
    :func:`labkit.capacity.sale_fleet_gpu`), and the promise is a token at least every ``promise_ms``."""
    gpus = {prefill + decode for prefill, decode, _ in setups}
    if len(gpus) != 1 or not chunk_budgets:
        raise ValueError(
            "every setup must use the same number of GPUs, to compare like with like, and at least one chunk budget "
            f"is needed for the colocated rows; got setups {[(p, d) for p, d, _ in setups]} and {chunk_budgets}"
        )
    total = gpus.pop()
    # No two of the sale's prompts share a block (lesson_sale), so a prefix cache would hash every block and find
    # nothing: off, the steps are the same and the table costs about 40% less CPU to compute.
    dials: dict[str, Any] = dict(num_blocks=num_blocks, max_num_seqs=max_num_seqs, enable_prefix_caching=False)
    rows = []
    for rate in rates:
        workload = lesson_sale(num_requests, rate, seed)
        for budget in chunk_budgets:
            chunked = simulate_fleet(workload, cost, "chunked", replicas=total, max_num_batched_tokens=budget, **dials)
            rows.append(_row(rate, f"chunked ({budget}-token steps)", chunked, promise_ms))
        for prefill_gpus, decode_gpus, link in setups:
            run = simulate_disaggregated(
                workload,
                cost,
                prefill_gpus=prefill_gpus,
                decode_gpus=decode_gpus,
                link=link,
                max_num_batched_tokens=chunk_budgets[0],
                **dials,
            )
            rows.append(_row(rate, f"{prefill_gpus}P+{decode_gpus}D, {link.describe()}", run, promise_ms))
    return rows


def format_table(rows: list[DisaggRow], promise_ms: float = 50.0) -> str:
    """The rows as text, with a line saying what the columns mean."""
    lines = [HEADER, "-" * len(HEADER)]
    for index, row in enumerate(rows):
        if index and row.rate != rows[index - 1].rate:
            lines.append("")
        lines.append(row.format())
    lines.append(
        f"times in ms; kept: share of requests that got every token within {promise_ms:g} ms of the one before; "
        "served/s: requests finished per second of the run"
    )
    return "\n".join(lines)
