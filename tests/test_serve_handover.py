"""The engine loop hands a whole step's outputs to the event loop at once (issue 33).

One wake-up of the event loop per step, however many requests the step served, so the engine
thread does not trade the GIL with the event loop once per request and token. Batched so, every
request's outputs must still arrive whole and in order, end with the finished one, and say what
the offline engine says; an error the engine loop answers between steps (the engine refusing a
request) must arrive at once, without waiting for a step that may never come.
"""

import asyncio

import pytest
from test_serve import chat_model, make_llm

import labkit.serve.worker as worker_module
from labkit.sampling import SamplingParams
from labkit.serve.prometheus import ServerMetrics
from labkit.serve.protocol import APIError
from labkit.serve.worker import EngineWorker

PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [13, 14], [15, 16, 17], [18, 19, 20, 21]]
LENGTHS = [12, 3, 9, 1, 7, 12]


@pytest.fixture(scope="module")
def model():
    return chat_model()


def counted(monkeypatch, llm):
    """Count the steps that ran and the hand-overs to the event loop (each a list of (handle, item))."""
    steps, handovers = [], []
    step, hand_over = llm.step, worker_module._hand_over

    def counting_step():
        outputs = step()
        if llm.last_step is not None:
            steps.append(len(outputs))
        return outputs

    def counting_hand_over(batch):
        handovers.append(len(batch))
        hand_over(batch)

    monkeypatch.setattr(llm, "step", counting_step)
    monkeypatch.setattr(worker_module, "_hand_over", counting_hand_over)
    return steps, handovers


def test_one_hand_over_per_step_brings_every_request_its_tokens_in_order(model, monkeypatch):
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in LENGTHS]
    offline = make_llm(model).generate(PROMPTS, params, use_tqdm=False)
    llm = make_llm(model, max_num_seqs=8)
    steps, handovers = counted(monkeypatch, llm)
    worker = EngineWorker(llm, ServerMetrics("tiny"))

    async def serve():
        worker.start()
        handles = [worker.submit(prompt, p) for prompt, p in zip(PROMPTS, params)]

        async def collect(handle):
            return [(list(output.token_ids), output.finished, piece) async for output, piece in handle.outputs()]

        seen = await asyncio.gather(*(collect(handle) for handle in handles))
        await asyncio.to_thread(worker.stop)
        return seen

    seen = asyncio.run(serve())
    for outputs, expected in zip(seen, offline):
        tokens = [token_ids for token_ids, _, _ in outputs]
        assert all(len(a) < len(b) and b[: len(a)] == a for a, b in zip(tokens, tokens[1:]))  # only growing
        assert [finished for _, finished, _ in outputs] == [False] * (len(outputs) - 1) + [True]
        assert tokens[-1] == expected.token_ids  # nothing lost, nothing added
        assert "".join(piece for _, _, piece in outputs) == expected.text
    assert sum(handovers) == sum(len(outputs) for outputs in seen)  # every output was handed over once
    assert len(handovers) <= len(steps)  # at most one wake-up per step ...
    assert max(handovers) > 1  # ... carrying several requests' outputs at once


def test_an_error_between_steps_is_handed_over_without_waiting_for_a_step(model, monkeypatch):
    llm = make_llm(model)
    steps, handovers = counted(monkeypatch, llm)
    worker = EngineWorker(llm, ServerMetrics("tiny"))
    refused = SamplingParams(max_tokens=4, logit_bias={llm.model.config.vocab_size + 5: 1.0})  # the engine says no

    async def serve():
        worker.start()
        handle = worker.submit([1, 2, 3], refused)
        try:
            with pytest.raises(APIError) as raised:
                async with asyncio.timeout(60):  # only against a hang: the error never came
                    async for _ in handle.outputs():
                        pass
        finally:
            await asyncio.to_thread(worker.stop)
        return raised.value

    error = asyncio.run(serve())
    assert error.status == 400 and "logit_bias" in error.message
    assert steps == [] and handovers == [1]  # the engine never stepped; the error came in a hand-over of its own
