"""The fleet loop on the wall clock: real engines behind a router, each request served once, one replica = one engine.

The simulator drives the same loop on the cost model's clock (test_sim_fleet.py). Here the tiny model serves
prompts that share a system prompt, so a router that looks at the replicas' caches has something to find.
"""

from dataclasses import replace

import pytest

from labkit.engine import LLM
from labkit.engine.fleet import generate_on_fleet, serve_workload_on_fleet
from labkit.engine.llm import serve_workload
from labkit.engine.reference import solo_greedy
from labkit.models import tiny_model
from labkit.sampling import SamplingParams
from labkit.workloads import as_token_ids, sharegpt_multiturn

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SYSTEM = list(range(2, 66))  # a 64-token system prompt: four full blocks of 16
PROMPTS = [SYSTEM + [100 + i, 7, 8 + i] for i in range(6)]
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)
DIALS = dict(num_blocks=64, block_size=16, max_num_seqs=4)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=3)


def test_one_replica_is_exactly_one_engine(model):
    alone = LLM(model, **DIALS)
    expected = [output.token_ids for output in alone.generate(PROMPTS, PARAMS, use_tqdm=False)]
    replica = LLM(model, **DIALS)
    outputs, where = generate_on_fleet([replica], PROMPTS, PARAMS)
    assert [output.token_ids for output in outputs] == expected and where == [0] * len(PROMPTS)
    plans = [[dict(step.scheduled) for step in llm.trace.steps] for llm in (alone, replica)]
    assert plans[0] == plans[1]  # the same steps, request by request and token by token


def test_every_request_is_served_once_with_the_tokens_it_gets_alone_and_no_block_is_kept(model):
    replicas = [LLM(model, **DIALS) for _ in range(3)]
    outputs, where = generate_on_fleet(replicas, PROMPTS, PARAMS, router="round_robin")
    assert where == [0, 1, 2, 0, 1, 2]
    assert [output.token_ids for output in outputs] == [
        solo_greedy(model, p, 6, ignore_eos=True).tokens for p in PROMPTS
    ]
    for replica, served in zip(replicas, ([0, 3], [1, 4], [2, 5])):
        assert sorted(int(record.request_id) for record in replica.trace.requests) == served
        assert replica.state.blocks.num_used_blocks == 0


class MostCached:
    """The replica that holds the most of this prompt; the least loaded among equals (lab material, not a dial)."""

    name = "most_cached"

    def __init__(self):
        self.shown = []

    def route(self, request, replicas):
        self.shown.append([replica.cached_tokens for replica in replicas])
        return max(replicas, key=lambda replica: (replica.cached_tokens, -replica.unfinished)).index


def test_a_router_that_reads_the_caches_sends_the_shared_prompt_where_it_is_cached(model):
    replicas = [LLM(model, **DIALS) for _ in range(2)]
    replicas[1].generate(SYSTEM + [9], SamplingParams(max_tokens=1), use_tqdm=False)  # replica 1 saw the system prompt
    router = MostCached()
    outputs, where = generate_on_fleet(replicas, PROMPTS[:2], PARAMS, router=router)
    assert router.shown[0] == [0, len(SYSTEM)] and where == [1, 1]
    assert all(output.finished for output in outputs)


def multiturn_token_workload(model, conversations: int = 5):
    """Multi-turn ShareGPT chats behind one system prompt, as stand-in token ids within the tiny model's vocabulary:
    every turn's prompt starts with the previous turn's."""
    workload = sharegpt_multiturn(
        conversations,
        seed=1,
        max_turns=3,
        max_prompt_tokens=160,
        max_output_tokens=4,
        think_time_s=2.0,
        conversation_gap_s=0.1,
        system_prompt="You are a helpful assistant of a shop; answer briefly.",
    )
    vocab = model.config.vocab_size
    requests = [
        replace(spec, prompt=[2 + token % (vocab - 2) for token in spec.prompt], output_len=min(spec.output_len, 4))
        for spec in as_token_ids(workload)
    ]
    return replace(workload, requests=tuple(requests))


def test_a_replayed_workload_on_one_replica_is_exactly_one_engine(model):
    workload = multiturn_token_workload(model, 3)
    workload = workload.with_arrival_times([0.0] * len(workload))  # arrivals alike on both clocks
    alone = LLM(model, **DIALS)
    serve_workload(alone, workload)
    replica = LLM(model, **DIALS)
    run = serve_workload_on_fleet([replica], workload, router="cache_aware")
    assert list(run.replica_of.values()) == [0] * len(workload) and run.router == "cache_aware"
    position = {spec.request_id: str(index) for index, spec in enumerate(workload)}  # generate() numbers them
    fleet_plans = [{position[key]: n for key, n in step.scheduled.items()} for step in run.traces[0].steps]
    assert [dict(step.scheduled) for step in alone.trace.steps] == fleet_plans  # the same steps, token by token
    assert [r.output_len for r in alone.trace.requests] == [r.output_len for r in run.traces[0].requests]


def test_cache_aware_finds_more_cached_tokens_than_round_robin_on_a_multiturn_replay(model):
    workload = multiturn_token_workload(model)
    runs = {
        router: serve_workload_on_fleet([LLM(model, **DIALS) for _ in range(2)], workload, router=router)
        for router in ("round_robin", "cache_aware")
    }
    hits = {router: run.summary().prefix_cache_hits for router, run in runs.items()}
    assert hits["cache_aware"] > 1.5 * hits["round_robin"], hits
    for run in runs.values():  # every request served once, on the replica it was sent to
        served = {r.request_id: index for index, trace in enumerate(run.traces) for r in trace.requests}
        assert served == run.replica_of and sorted(served) == sorted(spec.request_id for spec in workload)
