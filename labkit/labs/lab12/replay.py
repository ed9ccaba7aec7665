"""Lab 12's measurement: a multi-turn chat replay on two real replicas of the course model, one policy at a time.

Every conversation starts with one shop's system prompt and resends its history each turn, so there are two caches
to find: the system prompt, which every replica may hold, and a conversation's history, which only the replica that
served its last turn holds. Replica 0 has served one chat before the replay starts (a fleet that has been running).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from labkit.engine import LLM
from labkit.engine.fleet import LeastLoaded, RoundRobin, serve_workload_on_fleet
from labkit.engine.fleet_run import FleetRun
from labkit.engine.interfaces import ReplicaView, Router
from labkit.sampling import SamplingParams
from labkit.workloads import Workload, sharegpt_multiturn
from labkit.workloads.spec import Prompt

SYSTEM_PROMPT = (
    "You are the support assistant of an online shop that sells electronics. Answer briefly and politely, in "
    "the customer's language. Never promise a refund or a delivery date; offer to open a ticket instead. "
) * 2
# Each replica: prefix caching on (the default), eight sequences at a time, and a pool of 256 blocks (4,096 tokens),
# which holds the whole replay (1,688 prompt tokens) so nothing is evicted; a pool sized to the free memory (the
# default) took seconds to fill with zeros per replica, a tenth of a replay.
REPLICA_DIALS = dict(max_num_seqs=8, num_blocks=256)


class BoundRouter:
    """A function ``(replicas, max_imbalance) -> replica index`` as a router with its load bound fixed."""

    def __init__(self, choose: Callable[[Sequence[ReplicaView], float], int], max_imbalance: float, name: str):
        self.choose, self.max_imbalance, self.name = choose, max_imbalance, name

    def route(self, request: object, replicas: Sequence[ReplicaView]) -> int:
        return self.choose(replicas, self.max_imbalance)


def routing_policies(
    cache_aware_route: Callable[[Sequence[ReplicaView], float], int], bound: int = 2
) -> dict[str, Router]:
    """The four policies the lab compares: two blind to the cache, yours without a bound and with one."""
    return {
        "round robin": RoundRobin(),
        "least loaded": LeastLoaded(),
        "cache only (no bound)": BoundRouter(cache_aware_route, math.inf, "cache_only"),
        f"cache-aware (bound {bound})": BoundRouter(cache_aware_route, bound, "cache_aware"),
    }


def chat_replay(tokenizer, conversations: int = 5, seed: int = 0) -> Workload:
    """Short multi-turn ShareGPT chats behind the shop's system prompt: 2 or 3 turns of at most 256 tokens, four-token
    answers, conversations 0.2 s apart, the next turn 10 s after the last (the replay's clock skips idle time)."""
    return sharegpt_multiturn(
        conversations,
        seed=seed,
        tokenizer=tokenizer,
        min_turns=2,
        max_turns=3,
        max_prompt_tokens=256,
        max_output_tokens=4,
        think_time_s=10.0,
        conversation_gap_s=0.2,
        system_prompt=SYSTEM_PROMPT,
    )


@dataclass(frozen=True)
class PolicyRow:
    """What one policy's replay showed."""

    policy: str
    hit_rate: float  # share of prompt tokens found in a replica's prefix cache
    prefill_tokens: int  # prompt tokens computed (not found cached)
    ttft_p50_ms: float
    ttft_p99_ms: float
    served: tuple[int, ...]  # requests per replica

    def __str__(self) -> str:
        return (
            f"{self.policy:>24}  {self.hit_rate:6.1%}  {self.prefill_tokens:>7,}  {self.ttft_p50_ms:>8,.0f}  "
            f"{self.ttft_p99_ms:>8,.0f}  {' / '.join(map(str, self.served))}"
        )


HEADER = f"{'policy':>24}  {'hit rate':>6}  {'prefill':>7}  {'TTFT p50':>8}  {'TTFT p99':>8}  requests per replica"


def row(policy: str, run: FleetRun) -> PolicyRow:
    summary = run.summary()
    served = [0] * run.replicas
    for replica in run.replica_of.values():
        served[replica] += 1
    return PolicyRow(
        policy,
        summary.prefix_cache_hit_rate,
        summary.prefix_cache_queries - summary.prefix_cache_hits,
        summary.ttft_ms.median,
        summary.ttft_ms.p99,
        tuple(served),
    )


SERVED_BEFORE: Prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Hello!"}]


def replay(model, workload: Workload, router: Router, replicas: int = 2, served_before: Prompt = None) -> FleetRun:
    """``workload`` on fresh replicas of ``model`` behind ``router``; replica 0 has served one chat first
    (``served_before``, by default the shop's system prompt and a greeting)."""
    llms = [LLM(model, **REPLICA_DIALS) for _ in range(replicas)]
    llms[0].generate(served_before or SERVED_BEFORE, SamplingParams(max_tokens=1), use_tqdm=False)
    return serve_workload_on_fleet(llms, workload, router)


class PolicyTable:
    """The replay's table, filled one policy at a time, so that each policy's replay is a notebook cell of its own:
    one replay fits the grader's cell timeout on a busy 2-core machine, where all four in one cell did not."""

    def __init__(self, model, workload: Workload, routers: Mapping[str, Router], served_before: Prompt = None):
        self.model, self.workload, self.routers = model, workload, dict(routers)
        self.served_before = served_before  # what replica 0 served first (None: the shop's chat, SERVED_BEFORE)
        self.rows: list[PolicyRow] = []

    def add(self, policy: str) -> PolicyRow:
        """Replay the workload behind ``policy`` (one of the routers' names) and keep its row."""
        if policy not in self.routers:
            raise KeyError(f"no policy {policy!r} in this table; its policies are {', '.join(self.routers)}")
        run = replay(self.model, self.workload, self.routers[policy], served_before=self.served_before)
        self.rows.append(row(policy, run))
        return self.rows[-1]

    def run(self, policy: str) -> None:
        """:meth:`add` ``policy``, then print the table so far."""
        self.add(policy)
        print("\n".join([HEADER, *map(str, self.rows)]))


def compare_policies(model, workload: Workload, routers: Mapping[str, Router], **options) -> list[PolicyRow]:
    """Every policy's replay in one call, printed as a table as it goes (kept for notebooks handed out before the
    lab ran one policy a cell: PolicyTable, which takes ``options``)."""
    table = PolicyTable(model, workload, routers, **options)
    print(HEADER)
    for name in table.routers:
        print(table.add(name))
    return table.rows
