"""Lab 1, exercise 4: decoding without a cache, every step rerunning the whole sequence; each step is watched so that
the message names the step that goes wrong."""

from __future__ import annotations

from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.compare import compare_tokens
from labkit.grading.result import Mismatch
from labkit.kv.attention import attention
from labkit.labs.common.diagnose import check_attention, check_positions, diagnosed, prompt_returned
from labkit.labs.common.pieces import Piece, on_its_own
from labkit.labs.common.recording import RecordingModel
from labkit.labs.common.shared import course_model, ends_early_prompt, greedy_without_cache, pick_prompts
from labkit.labs.hints import register_hints
from labkit.labs.lab1.attention import ATTENTION
from labkit.labs.lab1.mask import MASK, course_causal_mask
from labkit.labs.lab1.prefill import PREFILL, course_prefill

# Tokens asked for in each case: a few, none at all, and more than the reply of ENDS_EARLY holds before
# its end-of-text (which this exercise ignores).
GENERATE_STEPS = (3, 0, 4)


def _generate_inputs(seed: int) -> tuple[Any, list[tuple[list[int], int]]]:
    """The course model and three cases (prompt, max_new_tokens) of different prompt lengths."""
    first, second = pick_prompts(seed, 2)
    if len(second) == len(first):
        second = second[:-1]  # asked for no tokens, so any cut of it is as good a case
    return course_model(), list(zip((first, second, ends_early_prompt()), GENERATE_STEPS))


def _run_generate(functions, inputs) -> list[dict[str, Any]]:
    model, cases = inputs
    runs = []
    for ids, steps in cases:
        # the first row of every pass's logits, to name "picked from logits[0]", and the last
        recording = RecordingModel(model, record_layers=1, logits_rows=(0, -1))
        tokens = functions[0](recording, list(ids), steps)
        runs.append({"tokens": tokens, "calls": recording.calls})
    return runs


def _generate_oracle(inputs) -> dict[str, Any]:
    model, cases = inputs
    return {
        "cases": [greedy_without_cache((model, ids, steps)) for ids, steps in cases],
        "eos": model.tokenizer.eos_token_id,
    }


def _returned_problem(want: list[int], prompt: list[int], mine: Any, eos: int) -> Mismatch | None:
    """Mistakes in what was returned that the passes alone would not show: the prompt too, a token for 0
    asked, a stop at end-of-text."""
    if not isinstance(mine, list) or mine == want:
        return None
    if returned := prompt_returned(prompt, mine, len(want)):
        return returned
    if not want:
        return Mismatch(
            f"max_new_tokens=0 asks for no tokens, and you returned {len(mine)}",
            "Generate exactly max_new_tokens tokens: with 0 the loop runs no times and returns [].",
        )
    if eos in want and len(mine) < len(want) and mine == want[: len(mine)] and len(mine) >= want.index(eos):
        return Mismatch(
            f"you returned {len(mine)} tokens, stopping at end-of-text ({eos}); {len(want)} were asked for",
            "Ignore end-of-text here: generate exactly max_new_tokens tokens (later labs' engine decides when "
            "a request stops).",
        )
    return None


def _never_called(want: list[int], calls: list[dict]) -> Mismatch | None:
    if want and not calls:
        return Mismatch("model.forward was never called", "Each new token needs one forward pass.")
    return None


def _new_tokens(tokens: Any) -> list[int]:
    return [int(t) for t in tokens] if isinstance(tokens, list) else []


def _pass_problem(prompt: list[int], tokens: Any, calls: list[dict]) -> Mismatch | None:
    """The first pass that did not rerun the whole sequence so far (prompt and every token picked), at 0, 1, ..."""
    mine = _new_tokens(tokens)
    for step, call in enumerate(calls[: len(mine)]):
        sent = call["input_ids"].tolist()
        whole = prompt + mine[:step]
        if sent != whole:
            hint = (
                "Without a cache the model remembers nothing between passes: each step must run the whole "
                "sequence, prompt plus every token generated so far."
            )
            if len(sent) < len(whole):
                return Mismatch(
                    f"step {step}: model.forward got {len(sent)} tokens, expected all {len(whole)} so far", hint
                )
            return Mismatch(f"step {step}: model.forward got {sent}, expected {whole}", hint)
        position_problem = check_positions(call["positions"], list(range(len(whole))), f"step {step}")
        if position_problem:
            return position_problem
    return None


def _tokens_problem(want: list[int], tokens: Any, calls: list[dict]) -> Mismatch | None:
    """The tokens against transformers' greedy ones (a pick from the first row named), or a pass too many."""
    mismatch = compare_tokens(want, tokens)
    if mismatch is None:
        if len(calls) > len(want):
            return Mismatch(
                f"{len(calls)} forward passes for {len(want)} new tokens",
                "One pass per new token: the pass that picks the last token is the last pass.",
            )
        return None
    mine = _new_tokens(tokens)
    step = next((i for i, (e, g) in enumerate(zip(want, mine)) if e != g), None)
    if step is not None and step < len(calls):
        logits = calls[step]["logits"]
        if int(logits[0].argmax()) == mine[step] != int(logits[-1].argmax()):
            return Mismatch(
                mismatch.difference,
                "You picked the token from the first row of the logits; the next "
                "token comes from the last row (logits[-1]).",
            )
    return mismatch


def _compare_case(expected, got, eos: int) -> Mismatch | None:
    """One case of the generation check: what came back, then the passes it made, then the tokens."""
    prompt, want, calls, tokens = expected["prompt"], expected["tokens"], got["calls"], got["tokens"]
    return (
        _returned_problem(want, prompt, tokens, eos)
        or _never_called(want, calls)
        or _pass_problem(prompt, tokens, calls)
        or check_attention(calls, keeps_history=False)
        or _tokens_problem(want, tokens, calls)
    )


def _compare_generate(expected, got) -> Mismatch | None:
    cases = expected["cases"]
    if not isinstance(got, list) or len(got) != len(cases):
        return Mismatch(f"expected one run per case ({len(cases)}), got {type(got).__name__}")
    for index, (want, have) in enumerate(zip(cases, got)):
        mismatch = _compare_case(want, have, expected["eos"])
        if mismatch is not None:
            steps = len(want["tokens"])
            return mismatch.within(f"case {index} (a {len(want['prompt'])}-token prompt, max_new_tokens={steps})")
    return None


GENERATE = diagnosed(
    Exercise(
        id="lab1.generate_without_cache",
        functions=("generate_without_cache",),
        make_inputs=_generate_inputs,
        run=_run_generate,
        oracle=_generate_oracle,
        compare=_compare_generate,
        tested="generate_without_cache(model, prompt, n) with the default model, on the course's own prefill (yours "
        "is checked on its own), for n = 3, 0 and 4 (a reply that reaches end-of-text, which this exercise "
        "ignores): every step reruns the whole sequence (positions from 0), exactly n greedy tokens equal to "
        "transformers' greedy choice, and only the new tokens returned",
        hint="Every step reruns the whole sequence so far through prefill and keeps the last row's most likely token, "
        'appended to the sequence and to the output. labkit.hint("lab1.generate_without_cache") shows more.',
    )
)
register(
    on_its_own(GENERATE, Piece(MASK, course_causal_mask), Piece(ATTENTION, attention), Piece(PREFILL, course_prefill))
)

register_hints(
    "lab1.generate_without_cache",
    "Without a cache the model remembers nothing: every step reruns the whole sequence so far (prompt plus the "
    "tokens chosen) and keeps only the prediction of its last position.",
    "Keep a growing copy of the sequence. Repeat max_new_tokens times: prefill it, take the most likely token of "
    "the last row, append it to the sequence and to the new tokens. Return only the new tokens.",
    "token = int(prefill(model, sequence)[-1].argmax()); copy prompt_ids first (list(prompt_ids)) so the caller's "
    "list is left alone.",
)
