"""``LLM.abort_request``: the engine side of a client hanging up.

A request can be aborted while it waits for its arrival, while it waits for a slot, or
while it runs; its blocks must be back in the pool at once, it must never produce
another token, and the requests beside it must say what they would have said without it.
"""

import pytest

from labkit.engine import LLM
from labkit.models import tiny_model
from labkit.sampling import SamplingParams

NUM_BLOCKS = 32


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=0)


def engine(model, **dials) -> LLM:
    return LLM(model, num_blocks=NUM_BLOCKS, block_size=4, max_model_len=128, **dials)


def run_to_end(llm: LLM) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    while llm.has_unfinished():
        for output in llm.step():
            tokens[output.request_id] = output.token_ids
    return tokens


def test_aborting_a_running_request_frees_its_blocks_and_spares_the_others(model):
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    alone = engine(model).generate([[5, 6, 7]], params, use_tqdm=False)[0].token_ids

    llm = engine(model)
    llm.add_request([9] * 30, params, request_id="leaver")
    llm.add_request([5, 6, 7], params, request_id="stayer")
    llm.step()
    llm.step()
    used_with_both = NUM_BLOCKS - llm.state.blocks.num_free_blocks
    assert llm.abort_request("leaver") is True
    used_after = NUM_BLOCKS - llm.state.blocks.num_free_blocks
    assert used_after < used_with_both  # freed at once, not at the next step
    outputs = run_to_end(llm)
    assert outputs["stayer"] == alone
    assert "leaver" not in outputs  # no token after the abort
    assert llm.state.blocks.num_free_blocks == NUM_BLOCKS
    finished = {record.request_id: record.finish_reason for record in llm.trace.requests}
    assert finished == {"leaver": "abort", "stayer": "length"}


def test_aborting_a_waiting_or_not_yet_arrived_request(model):
    llm = engine(model, max_num_seqs=1)
    params = SamplingParams(max_tokens=4)
    llm.add_request([1, 2, 3], params, request_id="running")
    llm.add_request([4, 5, 6], params, request_id="queued")
    llm.add_request([7, 8, 9], params, request_id="future", arrival_time=1e9)
    llm.step()  # "running" takes the only slot; "queued" waits
    assert llm.abort_request("queued") and llm.abort_request("future")
    outputs = run_to_end(llm)
    assert set(outputs) == {"running"}
    assert not llm.has_unfinished()  # the far-future arrival is gone too


def test_aborting_an_unknown_or_finished_request_says_so(model):
    llm = engine(model)
    llm.add_request([1, 2, 3], SamplingParams(max_tokens=2), request_id="done")
    run_to_end(llm)
    assert llm.abort_request("done") is False
    assert llm.abort_request("never-sent") is False
