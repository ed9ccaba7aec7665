"""Replicas behind a router: the one event loop of every run, simulated or real, one engine or many.

Why one loop: every run is the same events (a request arrives, a replica's step ends, a KV transfer lands), so
:meth:`Fleet.serve` moves one clock from event to event for all, whose executors (the cost model's step times, or
the model's passes) are all that differs. A request is routed the moment it arrives: the router
(:class:`~labkit.engine.interfaces.Router`) sees it (a :class:`~labkit.engine.interfaces.RequestView`) and, for
every replica, its unfinished requests and how much of this prompt its prefix cache holds. Then every replica whose
step has ended steps. :func:`labkit.sim.simulator.simulate` is a fleet of one, :func:`generate_on_fleet` real engines
with every arrival at time 0, :func:`labkit.sim.disagg.simulate_disaggregated` a prefill fleet with the KV transfers
as one more :class:`EventSource`.

Routers here are a few lines each over that view: :class:`RoundRobin`, :class:`LeastLoaded` and
:class:`CacheAware` (the longest cached prefix within a load bound; ``labkit route`` runs the same object over
HTTP), or a function ``(loads, n) -> replica index`` of your own (wrapped as a :class:`FunctionRouter`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from labkit.engine.core import Batch, EngineCore, Executor, StepOutcome
from labkit.engine.fleet_run import FleetRun
from labkit.engine.interfaces import ReplicaView, RequestView, Router, require
from labkit.engine.request import Request
from labkit.sampling_params import SamplingParams
from labkit.trace import RequestRecord

if TYPE_CHECKING:
    from labkit.engine.llm import LLM
    from labkit.engine.request import RequestOutput
    from labkit.models.tokens import Prompt
    from labkit.workloads import Workload


class RoundRobin:
    """Each replica in turn, blind to how busy it is."""

    name = "round_robin"

    def __init__(self) -> None:
        self.turn = 0

    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        index = self.turn % len(replicas)
        self.turn += 1
        return index


class LeastLoaded:
    """The replica with the fewest unfinished requests; the lowest index among equals (a load balancer's
    "least requests"; Envoy's compares two replicas drawn at random, this one all)."""

    name = "least_loaded"

    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        return min(replicas, key=lambda replica: replica.unfinished).index


class FunctionRouter:
    """A plain function ``(unfinished requests per replica, arrival number) -> replica index`` as a router."""

    def __init__(self, choose: Callable[[Sequence[int], int], int]):
        self.choose = choose
        self.name = getattr(choose, "__name__", "custom")
        self.turn = 0

    def route(self, request: RequestView, replicas: Sequence[ReplicaView]) -> int:
        index = self.choose([replica.unfinished for replica in replicas], self.turn)
        self.turn += 1
        return index


DEFAULT_MAX_IMBALANCE = 4  # requests; SGLang's router balances once loads differ by more than a few dozen


class CacheAware:
    """The longest cached prefix wins, within a load bound.

    A replica more than ``max_imbalance`` requests busier than the least busy one is not chosen, whatever it
    holds: without the bound, a system prompt every request shares would send every request to one replica.
    Among the rest, the most cached tokens win; then the fewest unfinished requests; then the lowest index.
    With nothing cached anywhere it is :class:`LeastLoaded`. SGLang's router routes the same way (prefix match
    first, the least loaded once loads grow uneven); llm-d's scheduler adds weighted scores for cache and load
    instead. ``max_imbalance=math.inf`` is the cache alone, unbounded.
    """

    name = "cache_aware"

    def __init__(self, max_imbalance: float = DEFAULT_MAX_IMBALANCE):
        if not max_imbalance >= 0:
            raise ValueError(f"max_imbalance must be 0 or more requests (math.inf: no bound), got {max_imbalance}")
        self.max_imbalance = max_imbalance

    def route(self, request: RequestView | None, replicas: Sequence[ReplicaView]) -> int:
        least = min(replica.unfinished for replica in replicas)
        allowed = [replica for replica in replicas if replica.unfinished - least <= self.max_imbalance]
        best = max(allowed, key=lambda replica: (replica.cached_tokens, -replica.unfinished, -replica.index))
        return best.index


# The one registry of routers by name: the simulator's and the engines' fleets and ``labkit route --policy`` read it.
ROUTERS: dict[str, type] = {"round_robin": RoundRobin, "least_loaded": LeastLoaded, "cache_aware": CacheAware}


def make_router(
    router: str | Router | Callable[[Sequence[int], int], int], max_imbalance: float = DEFAULT_MAX_IMBALANCE
) -> Router:
    """A router from its name (``max_imbalance`` is cache_aware's load bound), your own
    :class:`~labkit.engine.interfaces.Router` object, or a function."""
    if isinstance(router, str):
        if router not in ROUTERS:
            raise ValueError(
                f"unknown router {router!r}; use one of {sorted(ROUTERS)}, pass an object with route(request, "
                "replicas) and a name, or a function (loads, n) -> replica index"
            )
        return CacheAware(max_imbalance) if router == "cache_aware" else ROUTERS[router]()
    if hasattr(router, "route"):
        require(router, "routing")
        return router  # type: ignore[return-value]  # it has route and name, as require checked
    if callable(router):
        return FunctionRouter(router)
    raise TypeError(f"a router is a name, an object with route(request, replicas), or a function; got {router!r}")


def request_view(request: Request) -> RequestView:
    """What a router in an engine's fleet sees of a request: its id, its tokens, and its text if it came as text."""
    text = request.prompt if isinstance(request.prompt, str) else None
    return RequestView(request.request_id, text, tuple(request.prompt_token_ids))


class Arrivals:
    """Requests in order of arrival, each made (``make(index)``) only when the clock reaches its time: a
    100,000-request run holds only the live ones."""

    def __init__(self, times: Sequence[float], make: Callable[[int], Request]):
        self.times, self.make, self.position = times, make, 0

    @property
    def next_time(self) -> float | None:
        """When the next request arrives; None once every request has."""
        return self.times[self.position] if self.position < len(self.times) else None

    def due(self, now: float) -> Iterator[Request]:
        """The requests arriving at or before ``now``, in order."""
        while (arrival := self.next_time) is not None and arrival <= now:
            self.position += 1
            yield self.make(self.position - 1)


class EventSource(Protocol):
    """One more thing the fleet's clock stops for (a disaggregated run's KV transfers): it needs the clock next at
    ``next_time`` (None once it has nothing left), and ``advance(now)`` does what is due, before the replicas step."""

    @property
    def next_time(self) -> float | None: ...

    def advance(self, now: float) -> None: ...


@dataclass
class Replica:
    """One engine of the fleet and what the fleet keeps about it."""

    core: EngineCore
    execute: Executor
    step_end: float = 0.0  # when its step in flight ends; it takes its next step then
    live: list[RequestRecord] = field(default_factory=list)  # routed there and not finished


class Fleet:
    """Engines behind one router, on whatever clock their executors move. ``router=None`` sends every request to
    the first replica (a fleet of one, or a prefill engine beside its decode engine)."""

    def __init__(self, engines: Sequence[tuple[EngineCore, Executor]], router: Router | None = None):
        if not engines:
            raise ValueError("a fleet needs at least one replica")
        self.replicas = [Replica(core, execute) for core, execute in engines]
        self.router = router
        self.replica_of: dict[str, int] = {}  # request id -> the replica it was sent to, in order of arrival

    def views(self, request: Request, now: float) -> list[ReplicaView]:
        """Every replica as the router sees it at ``now``, for ``request``."""
        for replica in self.replicas:  # a request is unfinished until its finish time has come
            replica.live[:] = [r for r in replica.live if r.finish_time is None or r.finish_time > now]
        return [
            ReplicaView(index, len(replica.live), replica.core.cached_tokens(request))
            for index, replica in enumerate(self.replicas)
        ]

    def route(self, request: Request, now: float) -> int:
        """Send ``request`` (arriving at ``now``) to the replica the router picks; return its index."""
        index = 0 if self.router is None else self.router.route(request_view(request), self.views(request, now))
        if not (isinstance(index, int) and 0 <= index < len(self.replicas)):
            name = getattr(self.router, "name", None)
            raise ValueError(f"router {name!r} chose replica {index!r}; choose 0 to {len(self.replicas) - 1}")
        replica = self.replicas[index]
        replica.core.add(request)
        replica.live.append(request.record)
        self.replica_of[request.request_id] = index
        return index

    def has_unfinished(self) -> bool:
        return any(replica.core.has_unfinished() for replica in self.replicas)

    def next_step_end(self) -> float | None:
        """The earliest end of a busy replica's step (the simulator's next event), or None if all are idle."""
        ends = [replica.step_end for replica in self.replicas if replica.core.has_unfinished()]
        return min(ends) if ends else None

    def serve(
        self,
        arrivals: Arrivals,
        on_step: Callable[[int, StepOutcome], object] | None = None,
        beside: EventSource | None = None,
    ) -> None:
        """Run until every request has arrived and finished, moving the clock from event to event: the next arrival,
        the earliest end of a replica's step, or what ``beside`` waits for. ``on_step(index, outcome)`` follows steps."""
        while True:
            events = (self.next_step_end(), arrivals.next_time, None if beside is None else beside.next_time)
            times = [time for time in events if time is not None]
            if not times:
                return  # every request has arrived and finished, and nothing else is due
            now = min(times)
            for request in arrivals.due(now):
                self.route(request, now)
            if beside is not None:
                beside.advance(now)
            for index, outcome in self.step(now):
                if on_step is not None:
                    on_step(index, outcome)

    def step(self, now: float) -> list[tuple[int, StepOutcome]]:
        """Every replica with work whose step has ended by ``now`` takes its next step: (its index, the outcome)."""
        outcomes = []
        for index, replica in enumerate(self.replicas):
            if replica.core.has_unfinished() and replica.step_end <= now:
                outcome = replica.core.step(now, replica.execute)
                replica.step_end = now if outcome.record is None else outcome.record.end
                outcomes.append((index, outcome))
        return outcomes


def generate_on_fleet(
    llms: Sequence[LLM],
    prompts: Sequence[Prompt],
    sampling_params: SamplingParams | None = None,
    router: str | Router | Callable[[Sequence[int], int], int] = "round_robin",
) -> tuple[list[RequestOutput], list[int]]:
    """Serve ``prompts``, all arriving at time 0, on real engines (replicas of one model) behind ``router``, on the wall
    clock: every prompt's output in the order given, and the replica that served it.

    The replicas share this process and take turns on its cores (a step starts when the fleet offers the
    replica its turn), so this shows where requests go and what each replica's cache holds, not the speed
    of separate machines; ``labkit serve`` replicas behind a router are that.
    """

    def make(index: int) -> Request:
        return llms[0].request(prompts[index], sampling_params, request_id=str(index), arrival_time=0.0)

    fleet, finished = serve_engines(llms, make_router(router), [0.0] * len(prompts), make)
    ids = [str(index) for index in range(len(prompts))]
    return [finished[request_id] for request_id in ids], [fleet.replica_of[request_id] for request_id in ids]


def serve_workload_on_fleet(
    llms: Sequence[LLM],
    workload: Workload,
    router: str | Router | Callable[[Sequence[int], int], int] = "round_robin",
) -> FleetRun:
    """Replay ``workload`` on real engines behind ``router``, each replica as if on a machine of its own.

    Every forward pass is real and timed; a replica's clock moves by its passes' measured times, and the fleet's
    clock jumps from event to event (an arrival, the end of a replica's pass) as the simulator's does. So two
    replicas in this process are two machines, not two halves of one, and a replica the router overloads
    queues while the other idles. Each request answers exactly its intended length (``ignore_eos``). Returns the
    same :class:`FleetRun` as :func:`labkit.sim.fleet.simulate_fleet`; each replica's trace is also its
    ``llm.trace``.
    """

    def make(index: int) -> Request:
        spec = workload[index]
        params = SamplingParams(max_tokens=int(spec.output_len), ignore_eos=True)
        return llms[0].request(spec.prompt, params, request_id=spec.request_id, arrival_time=spec.arrival_time)

    chosen = make_router(router)
    fleet, _ = serve_engines(llms, chosen, [spec.arrival_time for spec in workload], make, timed=True)
    return FleetRun([llm.trace for llm in llms], fleet.replica_of, chosen.name)


def timed_replica(llm: LLM) -> tuple[EngineCore, Executor]:
    """``llm``'s core and an executor whose step ends when its pass would end on a machine of its own: the step's
    start on the fleet's clock plus the pass's measured time (see :func:`serve_workload_on_fleet`)."""

    def execute(batch: Batch, start: float) -> tuple[dict[str, int | list[int]], float]:
        began = time.perf_counter()
        tokens = llm.runner.execute(batch, llm.state.blocks)
        return tokens, start + time.perf_counter() - began

    return llm.core, execute


def serve_engines(
    llms: Sequence[LLM],
    router: Router | None,
    times: Sequence[float],
    make: Callable[[int], Request],
    timed: bool = False,
    after_step: Callable[[], object] | None = None,
) -> tuple[Fleet, dict[str, RequestOutput]]:
    """Real engines' runs, started afresh: serve the requests arriving at ``times`` (``make(index)`` makes each;
    ``timed``: each as if on a machine of its own), calling ``after_step()`` after every step; return the fleet
    and every finished output by request id."""
    fleet = Fleet([timed_replica(llm) if timed else llm.as_replica() for llm in llms], router)
    for llm in llms:
        llm.start_run()
    finished: dict[str, RequestOutput] = {}

    def collect(index: int, outcome: StepOutcome) -> None:
        finished.update((out.request_id, out) for out in llms[index].collect(outcome) if out.finished)
        if after_step is not None:
            after_step()

    fleet.serve(Arrivals(times, make), collect)
    return fleet, finished
