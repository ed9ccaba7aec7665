"""The engine with speculation on, and a learner's proposer or acceptance rule plugged in (lab 8).

Prompt lookup only pays when the text repeats itself, so the prompts here do, and the course model's greedy answers
go on repeating them: many drafts are accepted, some rejected. (The tiny random model would reject nearly every draft.)
"""

from __future__ import annotations

from typing import Any

from labkit.engine import LLM
from labkit.engine.reference import SoloRun, solo_greedy
from labkit.grading.attempt import describe_exception
from labkit.labs.common.engine_runs import MAX_STEPS, CheckRequest, TickClock
from labkit.labs.common.shared import course_model, rng
from labkit.sampling_params import SamplingParams

# Texts that repeat themselves: the course model continues each by repeating more of it.
REPETITIVE_TEXTS = (
    "Monday, Tuesday, Wednesday, Thursday. Monday, Tuesday, Wednesday, Thursday. Monday,",
    "red, green, blue, red, green, blue, red, green, blue, red,",
    "The cat sat on the mat. The cat sat on the mat. The cat",
    "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n    return",
    "one two three four five, one two three four five, one two",
    "Alice said hello. Bob said hello. Carol said hello. Dave said",
)


def repetitive_requests(seed: int, count: int, max_tokens: int = 20) -> list[CheckRequest]:
    """``count`` seeded texts from REPETITIVE_TEXTS as course-model token ids, arriving a tick or two apart."""
    r = rng(seed)
    tokenizer = course_model().tokenizer
    texts = r.sample(REPETITIVE_TEXTS, count)
    return [CheckRequest(list(tokenizer.encode(text)), max_tokens, float(i)) for i, text in enumerate(texts)]


def solo_course_runs(requests: list[CheckRequest]) -> list[SoloRun]:
    """Each request decoded alone by the course model, without speculation: the oracle of every speculating run."""
    model = course_model()
    return [solo_greedy(model, r.prompt_ids, r.max_tokens, ignore_eos=True) for r in requests]


def speculative_config(k: int, **pieces) -> dict[str, Any]:
    """Prompt lookup with ``k`` draft tokens, and any of the engine's pieces replaced by ``pieces``."""
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 1, **pieces}


def serve_speculating(requests: list[CheckRequest], k: int, watch_blocks: bool = False, **pieces) -> dict[str, Any]:
    """Serve the requests with speculation on (the learner's ``pieces`` plugged in), as plain data.

    Returns each request's tokens and the draft and accepted token counts, or ``error`` (one line)
    if the run stopped. With ``watch_blocks`` (prefix caching off, so every block is owned), it also
    returns the first step after which the running requests held more blocks than their computed
    tokens need, as ``(step, extra blocks)``, or None.
    """
    llm = LLM(
        course_model(),
        policy="chunked",
        clock=TickClock(),
        max_model_len=512,
        max_num_seqs=4,
        num_blocks=128,
        block_size=4,
        enable_prefix_caching=not watch_blocks,
        speculative_config=speculative_config(k, **pieces),
    )
    for i, r in enumerate(requests):
        params = SamplingParams(max_tokens=r.max_tokens, ignore_eos=True)
        llm.add_request(list(r.prompt_ids), params, request_id=f"r{i}", arrival_time=r.arrival)
    tokens: dict[str, list[int]] = {}
    excess = None
    try:
        for step in range(MAX_STEPS):
            if not llm.has_unfinished():
                break
            for output in llm.step():
                if output.finished:
                    tokens[output.request_id] = output.token_ids
            if watch_blocks and excess is None:
                blocks = llm.state.blocks
                held = sum(len(blocks.block_table(r.request_id)) for r in llm.state.running)
                needed = sum(blocks.blocks_for(r.num_computed_tokens) for r in llm.state.running)
                excess = (step, held - needed) if held > needed else None
        else:
            raise RuntimeError(f"the run passed {MAX_STEPS} steps without finishing")
    except NotImplementedError:
        raise  # an unfinished exercise: "not done", not "failed"
    except Exception as error:  # the learner's piece broke the run
        return {"error": describe_exception(error)}
    steps = llm.trace.steps
    return {
        "error": None,
        "tokens": [tokens[f"r{i}"] for i in range(len(requests))],
        "num_draft_tokens": sum(step.num_draft_tokens for step in steps),
        "num_accepted_tokens": sum(step.num_accepted_tokens for step in steps),
        "excess_blocks": excess,
    }
