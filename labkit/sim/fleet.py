"""Replicas behind a router, on one cost-model clock: what a second copy of the model buys, request by request.

Why: the planner (``plan(..., replicas=R)``) multiplies one replica by R, as if the router
spread the load perfectly. A real router decides each request as it arrives, knowing only
what it can see, and an unlucky choice queues a request behind a busy replica while another
stands idle: that shows in the tail (p99 TTFT), not in the mean. Here each replica is the
simulator's own engine core (:func:`~labkit.sim.simulator.simulated_core`: its scheduler, its
block pool, its trace), and one clock moves event by event, to the next arrival or to the
earliest end of a replica's step, whichever comes first.

The loop itself is the engine's (:class:`labkit.engine.fleet.Fleet`); this module moves its clock. Routers
(``router=``), from :mod:`labkit.engine.fleet`:

* ``"round_robin"``: request n goes to replica n mod R, whatever each is doing;
* ``"least_loaded"``: to the replica with the fewest unfinished requests, ties to the lowest index
  (a load balancer's "least requests"; Envoy's compares two replicas drawn at random, this one all);
* ``"cache_aware"``: to the replica holding the longest cached prefix of the request, within a load bound
  (:class:`~labkit.engine.fleet.CacheAware`, the policy ``labkit route`` runs);
* a :class:`~labkit.engine.interfaces.Router` object of your own, which also sees how much of each
  request's prompt every replica has cached;
* or a function ``(loads, n) -> replica index`` of your own, ``loads`` being each replica's unfinished requests.

Neither always wins. When answer lengths vary, round-robin can stack the long ones on one
replica while another idles, and least-loaded steers around it. When every request has one
shape, round-robin spaces each replica's arrivals evenly (every R-th one), while least-loaded
sends them in clumps, several in a row to the replica whose requests just finished, and their
prefills queue behind each other: a higher p99 TTFT.

Tensor parallelism inside a replica: give the cost model of one GPU's shard and its all-reduce
time per token, both from :func:`labkit.capacity.parallel.tensor_split`::

    split = tensor_split(SALE_GPU, LLAMA_3_1_70B, 4)
    cost = CostModel.from_parts(SALE_GPU, split.shard, overhead_s=0.003)
    simulate_fleet(workload, cost, replicas=2, allreduce_s_per_token=split.allreduce_s_per_token,
                   num_blocks=blocks_that_fit(SALE_GPU, split.shard))

Left out: the network between the router and the replicas, and a router's own delay.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from labkit.engine.config import EngineConfig
from labkit.engine.fleet import Fleet, make_router
from labkit.engine.fleet_run import FleetRun
from labkit.engine.interfaces import Router, SchedulerPolicy
from labkit.sim.cost_model import CostModel
from labkit.sim.simulator import serve_simulated, simulated_core
from labkit.workloads import Workload


def simulate_fleet(
    workload: Workload,
    cost: CostModel,
    policy: str | SchedulerPolicy | None = None,
    *,
    replicas: int = 1,
    router: str | Router | Callable[[Sequence[int], int], int] = "round_robin",
    config: EngineConfig | None = None,
    allreduce_s_per_token: float = 0.0,
    use_tqdm: bool = False,
    **settings: Any,
) -> FleetRun:
    """Serve ``workload`` with ``replicas`` copies of one engine behind ``router``, on one cost-model clock.

    ``cost``, ``policy``, ``config`` and the settings mean what they mean for
    :func:`~labkit.sim.simulator.simulate`, for each replica: ``num_blocks`` is one replica's
    pool. A policy object (a subclass of labkit's or any object with ``schedule``) is copied for every
    replica after the first, so none shares another's state. With ``replicas=1`` the run is exactly
    ``simulate``'s.
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be a whole number, 1 or more; got {replicas!r} (1 is a single engine)")
    chosen = make_router(router)
    fleet = Fleet(
        [
            simulated_core(
                workload,
                cost,
                policy if index == 0 or policy is None or isinstance(policy, str) else copy.deepcopy(policy),
                config=config,
                allreduce_s_per_token=allreduce_s_per_token,
                **settings,
            )
            for index in range(replicas)
        ],
        chosen,
    )
    serve_simulated(fleet, workload, f"simulate_fleet ({chosen.name})", use_tqdm)
    return FleetRun([replica.core.trace for replica in fleet.replicas], fleet.replica_of, chosen.name)
