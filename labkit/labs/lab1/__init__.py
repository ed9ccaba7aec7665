"""Lab 1, prefill and decode: the checks for its four exercises.

The learner writes a causal mask, attention with grouped-query heads, a prefill that runs the
whole prompt through ``model.forward`` in one pass, and a decode loop without a cache that
reruns the whole sequence for every new token. The oracles are the math (for the mask and
attention) and Hugging Face transformers' own forward pass (for prefill and decoding). Prefill
and decoding are graded on the course's own mask, attention and prefill (``on_its_own``), so one
mistake costs one point; the learner's own earlier pieces are checked on the side.
"""

from __future__ import annotations

from typing import Any

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.compare import compare_sequences, compare_tensors, compare_tokens
from labkit.grading.result import Mismatch
from labkit.kv.attention import attention, causal_mask
from labkit.labs.common.diagnose import (
    ATTENTION_TOLERANCE,
    check_attention,
    check_logits,
    check_positions,
    diagnosed,
    known_attention_mistakes,
)
from labkit.labs.common.pieces import Piece, on_its_own
from labkit.labs.common.recording import RecordingModel
from labkit.labs.common.shared import (
    course_model,
    ends_early_prompt,
    greedy_without_cache,
    on_check_device,
    pick_prompts,
    rng,
    torch_generator,
    transformers_logits,
)
from labkit.labs.hints import register_hints

# --- lab1.causal_mask ---------------------------------------------------------------------


def _mask_sizes(seed: int) -> tuple[list[int]]:
    return ([1, 2, 5, rng(seed).randint(6, 12)],)


def course_causal_mask(num_tokens: int) -> torch.Tensor:
    """The course's answer to exercise 1, used in place of the learner's when a later exercise is graded."""
    return causal_mask(num_tokens, num_tokens)


def _mask_oracle(inputs) -> dict[str, list[torch.Tensor]]:
    sizes = inputs[0]
    right = [causal_mask(n, n) for n in sizes]
    return {
        "masks": right,
        "future": [m.T.contiguous() for m in right],
        "no_self": [torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1) for n in sizes],
    }


def _compare_masks(expected, got) -> Mismatch | None:
    if isinstance(got, list) and len(got) == len(expected["masks"]):
        for index, (mask, future, no_self) in enumerate(
            zip(expected["masks"], expected["future"], expected["no_self"])
        ):
            mine = got[index]
            if isinstance(mine, torch.Tensor) and mine.shape == mask.shape and mine.dtype == torch.bool:
                if mask.shape[0] > 1 and torch.equal(mine, ~mask):
                    return Mismatch(
                        f"case {index} ({mask.shape[0]} tokens): your mask is True exactly where the key is hidden",
                        "True must mean *may look*: this mask marks the hidden keys (the convention of "
                        "nn.MultiheadAttention's attn_mask). Return the opposite: True where j <= i.",
                    )
                if mask.shape[0] > 1 and torch.equal(mine, future):
                    return Mismatch(
                        f"case {index} ({mask.shape[0]} tokens): row 0 lets the first token see every later token",
                        "You marked the future instead of the past: query i may look at key j when j <= i "
                        "(torch.tril), not j >= i.",
                    )
                if mask.shape[0] > 1 and torch.equal(mine, no_self):
                    return Mismatch(
                        f"case {index} ({mask.shape[0]} tokens): the diagonal is False",
                        "A token must be able to look at itself: use j <= i, not j < i.",
                    )
    return compare_sequences(
        expected["masks"], got, lambda e, g: compare_tensors(e, g, dims=("query", "key"), what="mask"), item="case"
    )


MASK = register(
    diagnosed(
        Exercise(
            id="lab1.causal_mask",
            functions=("causal_mask",),
            answers=("labkit.kv.attention.causal_mask",),
            make_inputs=_mask_sizes,
            run=lambda functions, inputs: [functions[0](n) for n in inputs[0]],
            oracle=_mask_oracle,
            compare=_compare_masks,
            tested="causal_mask(n) for n = 1, 2, 5 and one more: a bool [n, n] tensor, True where query i may see key j",
            hint="Query i may look at keys 0..i and no further: True on and below the diagonal, a bool tensor. "
            'labkit.hint("lab1.causal_mask") shows more.',
        )
    )
)

# --- lab1.attention -----------------------------------------------------------------------


def _attention_inputs(seed: int) -> tuple[list[tuple[torch.Tensor, ...]]]:
    generator = torch_generator(seed)
    cases = []
    for num_queries, num_keys in ((5, 5), (1, 6), (3, 7)):
        q = torch.randn(num_queries, 4, 8, generator=generator)
        k = torch.randn(num_keys, 2, 8, generator=generator)
        v = torch.randn(num_keys, 2, 8, generator=generator)
        cases.append((q, k, v, causal_mask(num_queries, num_keys)))
    return on_check_device((cases,))


def _attention_oracle(inputs) -> dict[str, Any]:
    cases = inputs[0]
    return {
        "outs": [attention(*case) for case in cases],
        "mistakes": [known_attention_mistakes(q, k, v, k, v) for q, k, v, _ in cases],
    }


def _compare_attention(expected, got) -> Mismatch | None:
    def one(index: int):
        def compare(want, have):
            mismatch = compare_tensors(
                want, have, dims=("query", "head", "dim"), what="attention output", **ATTENTION_TOLERANCE
            )
            if mismatch is not None and isinstance(have, torch.Tensor) and have.shape == want.shape:
                for hint, wrong in expected["mistakes"][index].items():
                    if torch.allclose(have, wrong, **ATTENTION_TOLERANCE):
                        return Mismatch(mismatch.difference, hint)
            return mismatch

        return compare

    if not isinstance(got, list) or len(got) != len(expected["outs"]):
        return compare_sequences(expected["outs"], got, lambda e, g: None, item="case")
    for index, (want, have) in enumerate(zip(expected["outs"], got)):
        mismatch = one(index)(want, have)
        if mismatch is not None:
            q_len = want.shape[0]
            return mismatch.within(f"case {index} ({q_len} queries, 4 query heads sharing 2 KV heads)")
    return None


ATTENTION = register(
    diagnosed(
        Exercise(
            id="lab1.attention",
            functions=("attention",),
            answers=("labkit.kv.attention.attention",),
            make_inputs=_attention_inputs,
            run=lambda functions, inputs: [functions[0](*case) for case in inputs[0]],
            oracle=_attention_oracle,
            compare=_compare_attention,
            tested="attention(q, k, v, mask) on 3 random cases (4 query heads, 2 KV heads, head_dim 8, "
            "5x5, 1x6 and 3x7 queries x keys) against softmax(q·kᵀ/√D + mask)·v",
            hint="Each group of Hq // Hkv query heads shares one KV head; scores are q·kᵀ / √D, forbidden keys get -inf "
            "before the softmax over the keys, and the weights mix the values back to [Tq, Hq, D]. "
            'labkit.hint("lab1.attention") shows more.',
        )
    )
)

# --- lab1.prefill -------------------------------------------------------------------------


def course_prefill(model, prompt_ids: list[int]) -> torch.Tensor:
    """The course's answer to exercise 3, used in place of the learner's when exercise 4 is graded."""
    n = len(prompt_ids)
    mask = causal_mask(n, n, model.device)
    ids, positions = torch.tensor(prompt_ids, device=model.device), torch.arange(n, device=model.device)
    return model.forward(ids, positions, lambda layer, q, k, v: attention(q, k, v, mask))


def _one_prompt(seed: int) -> tuple[Any, list[int]]:
    return course_model(), pick_prompts(seed, 1)[0]


def _run_prefill(functions, inputs) -> dict[str, Any]:
    model, ids = inputs
    recording = RecordingModel(model)
    logits = functions[0](recording, list(ids))
    return {"logits": logits, "calls": recording.calls}


def _compare_prefill(expected, got) -> Mismatch | None:
    calls = got["calls"]
    prompt = expected["prompt"]
    if len(calls) != 1:
        return Mismatch(
            f"prefill called model.forward {len(calls)} times",
            "Prefill is one pass: call model.forward once with all the prompt's tokens.",
        )
    sent = calls[0]["input_ids"].tolist()
    if sent != prompt:
        hint = "Pass the prompt's token ids, in order, as one LongTensor."
        if sent == prompt[:-1]:
            hint = (
                "The prompt's last token is missing: its row of the logits predicts the reply's first token, "
                "so every one of the T prompt tokens goes into the pass (torch.tensor(prompt_ids))."
            )
        return Mismatch(f"model.forward got token ids {sent}, expected the prompt {prompt}", hint)
    mismatch = check_positions(calls[0]["positions"], list(range(len(prompt))), "the prefill pass") or check_attention(
        calls, keeps_history=False
    )
    return mismatch or check_logits(expected["logits"], got["logits"], "logits")


PREFILL = diagnosed(
    Exercise(
        id="lab1.prefill",
        functions=("prefill",),
        make_inputs=_one_prompt,
        run=_run_prefill,
        oracle=lambda inputs: {"logits": transformers_logits(*inputs), "prompt": list(inputs[1])},
        compare=_compare_prefill,
        tested="prefill(model, prompt) on a short prompt with the default model (with the course's causal_mask and "
        "attention in place of yours, which are checked on their own): one forward pass, positions 0..T-1, causal "
        "attention at every layer, logits [T, vocab] equal to transformers' own forward pass",
        hint="One model.forward over the whole prompt: its ids, positions 0 .. T-1, and an attend that is your attention "
        'with your causal mask, all on model.device. labkit.hint("lab1.prefill") shows more.',
    )
)
register(on_its_own(PREFILL, Piece(MASK, course_causal_mask), Piece(ATTENTION, attention)))

# --- lab1.generate_without_cache ------------------------------------------------------------

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
    if mine == prompt + want:
        return Mismatch(
            f"you returned {len(mine)} tokens: the prompt's {len(prompt)} and then the {len(want)} new ones",
            "Return only the new tokens (the caller already has the prompt).",
        )
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


def _compare_case(expected, got, eos: int) -> Mismatch | None:
    """One case of the generation check: what came back, then the passes it made, then the tokens."""
    prompt, want, calls, tokens = expected["prompt"], expected["tokens"], got["calls"], got["tokens"]
    problem = _returned_problem(want, prompt, tokens, eos)
    if problem:
        return problem
    mismatch = compare_tokens(want, tokens)
    if want and not calls:
        return Mismatch("model.forward was never called", "Each new token needs one forward pass.")
    mine = [int(t) for t in tokens] if isinstance(tokens, list) else []
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
    attention_problem = check_attention(calls, keeps_history=False)
    if attention_problem:
        return attention_problem
    if mismatch is None:
        if len(calls) > len(want):
            return Mismatch(
                f"{len(calls)} forward passes for {len(want)} new tokens",
                "One pass per new token: the pass that picks the last token is the last pass.",
            )
        return None
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


# --- hints, one tier per labkit.hint() call: the idea, the structure, then near-code -----

register_hints(
    "lab1.causal_mask",
    "Query i may look at key j exactly when j is not after i. Draw the T x T grid: the allowed cells are the "
    "diagonal and everything below it.",
    "Start from a T x T grid of True and keep only its lower triangle, diagonal included; the result must be bool.",
    "torch.tril keeps the lower triangle (diagonal included) of a matrix; torch.ones(T, T, dtype=torch.bool) is the "
    "grid to start from.",
)
register_hints(
    "lab1.attention",
    "Each query head scores every key it may see (q·k / √D), turns the scores into weights that sum to 1 (softmax, "
    "with forbidden keys at -inf so they get weight 0), and returns the weighted sum of the values. With "
    "grouped-query attention, several query heads read the same KV head.",
    "1. Give every query head its KV head: repeat each KV head Hq // Hkv times along the head axis, for k and v. "
    "2. Scores [Hq, Tq, Tk], divided by √D. 3. Where the mask is False, -inf. 4. Softmax over the keys (the last "
    "axis). 5. Weighted sum of the values, back to [Tq, Hq, D].",
    'k.repeat_interleave(Hq // Hkv, dim=1) (same for v); torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(D); '
    'scores.masked_fill(~mask, float("-inf")); torch.softmax(scores, dim=-1); '
    'torch.einsum("hqk,khd->qhd", weights, v).',
)
register_hints(
    "lab1.prefill",
    "One call to model.forward does the whole prompt. You supply the tokens, their positions 0 .. T-1, and an "
    "attend callback that is your attention with your causal mask.",
    "Make the ids and the positions as integer tensors of length T on model.device, and the T x T mask on the same "
    "device; define attend(layer, q, k, v) that returns attention(q, k, v, mask); return what model.forward gives.",
    "torch.tensor(prompt_ids, device=model.device); torch.arange(T, device=model.device); "
    "causal_mask(T).to(model.device); model.forward(ids, positions, attend).",
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
