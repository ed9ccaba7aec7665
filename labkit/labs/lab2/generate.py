"""Lab 2, exercise 2: decoding with the cache, every pass watched, against the run without one; a wrong decoding whose
cache also fails exercise 1's check is blamed on the cache."""

from __future__ import annotations

from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.compare import compare_sequences, compare_tokens
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import check_attention, check_logits, check_positions, prompt_returned, raised_mismatch
from labkit.labs.common.learner_errors import capture, raised_in
from labkit.labs.common.recording import RecordingModel
from labkit.labs.common.shared import greedy_without_cache, prompt_and_steps
from labkit.labs.hints import register_hints
from labkit.labs.lab2.cache import cache_inputs, cache_oracle, compare_cache, run_cache


def _generate_inputs(seed: int) -> dict[str, Any]:
    """The course model, a prompt and a token count; and exercise 1's inputs, to check the cache it uses."""
    return {"generate": prompt_and_steps(seed), "cache": cache_inputs(seed)}


def _run_generate(functions, inputs) -> dict[str, Any]:
    model, ids, steps = inputs["generate"]
    recording = RecordingModel(model)
    tokens = capture(functions, lambda: functions[0](recording, list(ids), steps))
    return {
        "tokens": tokens,
        "calls": recording.calls,
        "cache": capture(functions[1:], lambda: run_cache(functions[1:], inputs["cache"])),
    }


def _generate_oracle(inputs) -> dict[str, Any]:
    return {**greedy_without_cache(inputs["generate"]), "cache": cache_oracle(inputs["cache"])}


def _prefill_problem(prompt: list[int], first: dict) -> Mismatch | None:
    if first["input_ids"].tolist() != prompt:
        return Mismatch(
            f"the first forward pass got {first['input_ids'].tolist()}, expected the prompt {prompt}",
            "Start with one prefill pass over the whole prompt.",
        )
    return check_positions(first["positions"], list(range(len(prompt))), "the prefill pass")


def _decode_pass_problem(prompt: list[int], calls: list[dict]) -> Mismatch | None:
    """The first decode pass that fed more than one token, not the token picked last, or at the wrong position."""
    for step, call in enumerate(calls[1:], start=1):
        sent = call["input_ids"].tolist()
        if len(sent) != 1:
            return Mismatch(
                f"step {step}: model.forward got {len(sent)} tokens, expected only the newest one",
                "With a cache the earlier tokens' K and V are already stored: feed just the token you "
                "picked last, and let attention read the rest from the cache.",
            )
        picked = int(calls[step - 1]["logits"][-1].argmax())  # what the pass before chose, whatever was returned
        if sent[0] != picked:
            return Mismatch(
                f"step {step}: model.forward got token {sent[0]}, but the pass before picked {picked}",
                "Feed back the token you just chose.",
            )
        mismatch = check_positions(call["positions"], [len(prompt) + step - 1], f"step {step}")
        if mismatch:  # a cache that forgets also miscounts: name the earlier cause when there is one
            return check_attention(calls[:step], keeps_history=True) or mismatch
    return None


def _pass_count_problem(passes: int, steps: int) -> Mismatch | None:
    if passes == steps:
        return None
    return Mismatch(
        f"{passes} forward passes for {steps} new tokens, expected {steps}: one token per pass",
        "The prefill's logits already give the first new token, and each later pass gives one more, so the "
        "last token needs no pass after it."
        if passes > steps
        else "Each new token after the first needs one decode pass.",
    )


def _logits_problem(expected: list, calls: list[dict]) -> Mismatch | None:
    """Each pass's last row of logits against the run without a cache, step by step."""
    last_rows = [call["logits"][-1] for call in calls]
    return compare_sequences(expected, last_rows, lambda e, g: check_logits(e, g, "logits"), item="step")


def _decoding_problem(expected, got) -> Mismatch | None:
    """The first thing wrong with the decoding itself: its passes, positions, attention, logits, tokens."""
    prompt, calls, steps, tokens = expected["prompt"], got["calls"], len(expected["tokens"]), got["tokens"]
    record = raised_in(tokens)
    if record is not None:
        return raised_mismatch(record, None)
    if not calls:
        return Mismatch("model.forward was never called", "Prefill the prompt once, then one pass per new token.")
    return (
        _prefill_problem(prompt, calls[0])
        or _decode_pass_problem(prompt, calls)
        or check_attention(calls, keeps_history=True)
        or _pass_count_problem(len(calls), steps)
        or _logits_problem(expected["logits"], calls)
        or prompt_returned(prompt, tokens, steps)
        or compare_tokens(expected["tokens"], tokens)
    )


def _compare_generate(expected, got) -> Mismatch | None:
    """Decoding first; when it is wrong and exercise 1's cache is wrong too, the cache is named as the cause."""
    problem = _decoding_problem(expected, got)
    if problem is None:
        return None
    record = raised_in(got["cache"])
    cache_problem = raised_mismatch(record, None) if record else compare_cache(expected["cache"], got["cache"])
    if cache_problem is None:
        return problem
    return Mismatch(
        f"your KVCache does not pass exercise 1's check yet ({cache_problem.difference}), and this decoding uses it",
        "Fix exercise 1 first, then run this check again. "
        + (cache_problem.hint or "Run exercise 1's check: it says where the cache goes wrong."),
    )


register(
    Exercise(
        id="lab2.generate_with_cache",
        functions=("generate_with_cache", "KVCache"),
        answers=("labkit.kv.contiguous.ContiguousKVCache",),  # exercise 1's: no labkit function decodes for it
        make_inputs=_generate_inputs,
        run=_run_generate,
        oracle=_generate_oracle,
        compare=_compare_generate,
        tested="generate_with_cache(model, prompt, n) with the default model: one prefill pass, then one token per pass at "
        "the right position (n passes in all), attention over the whole cache, the logits at every step equal to the "
        "run without a cache (transformers' own forward pass over the whole sequence), and only the n new tokens "
        "returned",
        hint="Prefill the whole prompt once through a fresh cache; then feed only the newest token, at the position "
        'that counts the tokens already cached. labkit.hint("lab2.generate_with_cache") shows more.',
    )
)

register_hints(
    "lab2.generate_with_cache",
    "Only the first pass needs the whole prompt; after it, the cache remembers every earlier token, so each pass "
    "feeds only the token picked last. The prefill's logits already give the first new token, so n new tokens take "
    "n passes.",
    "Make one KVCache for the sequence. Prefill: the prompt at positions 0 .. T-1, with the cache's attend as the "
    "callback. Then repeat: pick the argmax of the last row of logits; stop once you have n tokens; otherwise run "
    "a pass on that one token, at the position that counts the tokens already cached (cache.length).",
    "model.forward(torch.tensor(prompt_ids, device=model.device), torch.arange(T, device=model.device), "
    "cache.attend); then model.forward(torch.tensor([token], device=model.device), "
    "torch.tensor([cache.length], device=model.device), cache.attend). Return the new tokens only.",
)
