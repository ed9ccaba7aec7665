"""The fleet loop on the wall clock: real engines behind a router, each request served once, one replica = one engine.

The simulator drives the same loop on the cost model's clock (test_sim_fleet.py). Here the tiny model serves
prompts that share a system prompt, so a router that looks at the replicas' caches has something to find.
"""

import pytest

from labkit.engine import LLM
from labkit.engine.fleet import generate_on_fleet
from labkit.engine.reference import solo_greedy
from labkit.models import tiny_model
from labkit.sampling import SamplingParams

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
