"""One step loop, two clocks: the real engine and the simulator plan the same steps and fail the same way.

Every request arrives at once, so timing cannot decide who is admitted when: the two runs
must agree step by step (who ran, with how many tokens, whom the policy preempted), and a
policy bug must raise the same error on both.
"""

import numpy as np
import pytest

from labkit.capacity import LESSON_LLAMA_8B, SALE_GPU
from labkit.engine import LLM
from labkit.engine.scheduler import ContinuousBatching, SchedulerOutput, SchedulerState, make_policy
from labkit.models import tiny_model
from labkit.sampling import SamplingParams
from labkit.sim import CostModel
from labkit.sim.simulator import simulate
from labkit.workloads import replay_workload

COST = CostModel.from_parts(SALE_GPU, LESSON_LLAMA_8B)
# 80 token slots for four sequences: every policy preempts; chunked prefill cuts prompts at 24.
DIALS = dict(num_blocks=10, block_size=8, max_num_seqs=4, max_model_len=128)


class ForgetsDecodes(ContinuousBatching):
    """A buggy policy: admits prompts, then never schedules the requests it is running."""

    name = "forgets-decodes"

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        output = SchedulerOutput()
        while state.waiting and len(state.running) < state.max_num_seqs:
            request = state.waiting[0]
            if not state.blocks.can_allocate(request.request_id, request.num_missing_tokens):
                break
            state.admit(request, request.num_missing_tokens)
            output.scheduled[request.request_id] = request.num_missing_tokens
        return output


@pytest.fixture(scope="module")
def workload():
    rng = np.random.default_rng(3)
    prompt_lens = rng.integers(3, 40, size=10).tolist()
    # three families of prompts that share prefixes: both clocks find them in the cache alike
    prompts = [list(range(2 + 50 * (i % 3), 2 + 50 * (i % 3) + n)) for i, n in enumerate(prompt_lens)]
    return replay_workload([0.0] * 10, prompt_lens, rng.integers(1, 25, size=10).tolist(), prompts)


def engine_run(workload, policy, budget):
    """The real engine on the tiny model: every request's tokens computed and sampled for real."""
    llm = LLM(tiny_model(), policy=policy, max_num_batched_tokens=budget, **DIALS)
    for spec in workload:
        llm.add_request(
            spec.prompt,
            SamplingParams(max_tokens=spec.output_len, ignore_eos=True),
            request_id=spec.request_id,
            arrival_time=0.0,
        )
    while llm.has_unfinished():
        llm.step()
    return llm.trace


def schedule(trace):
    return [(step.scheduled, step.slots_held, step.preempted) for step in trace.steps]


@pytest.mark.parametrize("policy, budget", [("static", 128), ("continuous", 128), ("chunked", 24)])
def test_a_good_policy_plans_the_same_steps_on_both_clocks(workload, policy, budget):
    engine = engine_run(workload, make_policy(policy), budget)
    simulated = simulate(workload, COST, make_policy(policy), max_num_batched_tokens=budget, **DIALS)
    assert schedule(engine) == schedule(simulated)
    assert sum(len(step.preempted) for step in engine.steps) > 0
    assert sum(step.prefix_cache_hits for step in engine.steps) > 0
    assert (
        [r.output_len for r in engine.requests]
        == [r.output_len for r in simulated.requests]
        == workload.output_lens.tolist()
    )


def test_a_buggy_policy_fails_the_same_way_on_both_clocks(workload):
    with pytest.raises(RuntimeError) as on_engine:
        engine_run(workload, ForgetsDecodes(), 128)
    with pytest.raises(RuntimeError) as on_simulator:
        simulate(workload, COST, ForgetsDecodes(), max_num_batched_tokens=128, **DIALS)
    assert str(on_engine.value) == str(on_simulator.value)
    assert "scheduled nothing although requests are unfinished" in str(on_engine.value)
