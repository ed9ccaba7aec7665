"""Lab 6, exercise 3: how a long prompt is cut into chunks while other requests decode, checked by arithmetic
(:func:`chunks_oracle`) and against the chunks the learner's own policy gives in the engine."""

from __future__ import annotations

from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.engine_runs import CheckRequest, policy_from_function, serve
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints
from labkit.labs.lab6.schedule import CHUNKED_ANSWERS


def chunks_oracle(prompt_len: int, budget: int, num_decoding: int) -> list[int]:
    """Decode-first: each step the prompt gets what num_decoding decodes leave of the budget."""
    room = budget - num_decoding
    full, rest = divmod(prompt_len, room)
    return [room] * full + ([rest] if rest else [])


def chunk_cases(seed: int) -> list[tuple[int, int, int]]:
    """(prompt_len, budget, num_decoding): seeded, plus an exact multiple and a prompt that fits one step; the first
    is also served in the engine."""
    r = rng(seed)
    room = r.randint(8, 20)
    decoding = r.randint(1, 4)
    return [
        (r.randint(40, 120), room + decoding, decoding),
        (3 * room, room + decoding, decoding),
        (room - 2, room + decoding, decoding),
        (r.randint(30, 90), r.randint(10, 30), 0),
    ]


def engine_chunks(policy, prompt_len: int, budget: int, num_decoding: int, seed: int) -> list[int] | dict:
    """The chunks the engine gives a prompt that arrives while ``num_decoding`` requests decode."""
    r = rng(seed)
    chatting = [CheckRequest([r.randint(2, 255) for _ in range(4)], 60) for _ in range(num_decoding)]
    document = CheckRequest([r.randint(2, 255) for _ in range(prompt_len)], 1, arrival=6.0)
    run = serve(
        chatting + [document],
        policy,
        max_num_seqs=num_decoding + 1,
        num_blocks=64,
        block_size=8,
        max_num_batched_tokens=budget,
    )
    if run["error"]:
        return run
    doc_id = f"r{num_decoding}"
    return [d["scheduled"][doc_id] for d in run["decisions"] if doc_id in d["scheduled"]]


def _run_chunks(functions, inputs) -> dict[str, Any]:
    predict, schedule = functions
    prompt_len, budget, decoding = inputs["cases"][0]
    return {
        "predicted": [list(predict(*case)) for case in inputs["cases"]],
        "engine": engine_chunks(policy_from_function(schedule, chunked=True), prompt_len, budget, decoding, 0),
    }


def _compare_chunks(expected, got) -> Mismatch | None:
    if got["engine"] != expected["engine"]:
        return Mismatch(
            f"your chunked_schedule cut a {expected['cases'][0][0]}-token prompt into {got['engine']!s:.120} "
            f"while {expected['cases'][0][2]} requests decoded, not {expected['engine']}; this exercise predicts "
            "what exercise 1's policy does",
            "Fix exercise 1 first, then run this check again (its check says what to fix).",
        )
    for (prompt_len, budget, decoding), want, have in zip(expected["cases"], expected["chunks"], got["predicted"]):
        if have == want:
            continue
        where = f"a {prompt_len}-token prompt, budget {budget}, {decoding} decoding"
        hint = (
            "Each step the decodes take their tokens first; the prompt gets the rest, and its last chunk is the rest."
        )
        if decoding and have == chunks_oracle(prompt_len, budget, 0):
            hint = f"Each step the {decoding} decoding requests take one token each before the prompt gets any."
        elif sum(have) > prompt_len:
            hint = "The chunks add up to more than the prompt: the last chunk is only what is left of it."
        elif sum(have) < prompt_len:
            hint = "The chunks add up to less than the prompt: the last, shorter chunk is missing."
        return Mismatch(f"{where}: expected chunks {want}, got {have}", hint)
    return None


register(
    diagnosed(
        Exercise(
            id="lab6.prefill_chunks",
            functions=("prefill_chunks", "chunked_schedule"),
            answers=("labkit.labs.lab6.chunks_oracle", *CHUNKED_ANSWERS),
            make_inputs=lambda seed: {"cases": chunk_cases(seed)},
            run=_run_chunks,
            oracle=lambda inputs: {
                "cases": inputs["cases"],
                "chunks": [chunks_oracle(*case) for case in inputs["cases"]],
                "engine": chunks_oracle(*inputs["cases"][0]),
            },
            compare=_compare_chunks,
            tested="prefill_chunks(prompt_len, budget, num_decoding) on four seeded cases (one an exact multiple, one "
            "shorter than a step) gives decode-first chunks, and your chunked_schedule cuts the first case's prompt "
            "the same way in the engine",
            hint="Count what the decoding requests take from each step's budget; the prompt gets the rest. "
            'labkit.hint("lab6.prefill_chunks") shows more.',
        )
    )
)

register_hints(
    "lab6.prefill_chunks",
    "Decodes first: every step, each decoding request takes one token of the budget before the prompt gets any.",
    "room = budget - num_decoding tokens a step for the prompt: as many full chunks of room as fit, then the "
    "remainder if there is one.",
    "full, rest = divmod(prompt_len, budget - num_decoding); [room] * full + ([rest] if rest else []).",
)
