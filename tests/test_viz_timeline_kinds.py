"""The timeline's prefill and decode, on real engine runs: every step drawn as the engine booked it.

The engine's trace says, per step, how many tokens were prefill and how many decode. The timeline
reads each request's state from the trace alone; here the two must agree step by step, also with
prefix caching on, where a request computes fewer tokens than its prompt holds (a bug once drew
every later one-token step of such a request as prefill), and with preemptions, where a request
recomputes.
"""

import matplotlib

matplotlib.use("Agg")

import pytest

from labkit.labs.common.engine_runs import run_requests
from labkit.labs.lab7.runs import chat_requests
from labkit.viz.timeline import _step_kinds


def drawn_tokens(trace) -> list[tuple[int, int]]:
    """Per step, the tokens of the requests drawn as prefill and as decode."""
    out = []
    for step, kinds in zip(trace.steps, _step_kinds(trace)):
        prefill = sum(n for rid, n in step.scheduled.items() if kinds[rid] == "prefill")
        decode = sum(n for rid, n in step.scheduled.items() if kinds[rid] == "decode")
        out.append((prefill, decode))
    return out


@pytest.mark.parametrize(
    "dials",
    [
        pytest.param(dict(enable_prefix_caching=True, num_blocks=40), id="prefix caching, roomy"),
        pytest.param(dict(enable_prefix_caching=True, num_blocks=20), id="prefix caching, preempting"),
        pytest.param(dict(enable_prefix_caching=False, num_blocks=40), id="no caching"),
    ],
)
def test_every_step_is_drawn_as_the_engine_booked_it(dials):
    llm, _ = run_requests(chat_requests(0), max_num_seqs=3, block_size=4, **dials)
    trace = llm.trace
    booked = [(step.num_prefill_tokens, step.num_decode_tokens) for step in trace.steps]
    assert drawn_tokens(trace) == booked
    if dials["enable_prefix_caching"]:
        assert sum(step.prefix_cache_hits for step in trace.steps) > 0  # the run does find cached prefixes


def test_a_cached_prefix_run_draws_no_decode_step_as_prefill():
    llm, _ = run_requests(chat_requests(0), max_num_seqs=3, block_size=4, enable_prefix_caching=True, num_blocks=40)
    trace = llm.trace
    decode_only = [(step, kinds) for step, kinds in zip(trace.steps, _step_kinds(trace)) if not step.num_prefill_tokens]
    assert decode_only
    for step, kinds in decode_only:
        drawn = {rid: kinds[rid] for rid in step.scheduled}
        assert set(drawn.values()) == {"decode"}, f"step {step.index}, decode only, drawn as {drawn}"
