"""Lab 1, exercise 3: prefill, the whole prompt in one forward pass, checked against transformers."""

from __future__ import annotations

from typing import Any

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.kv.attention import attention, causal_mask
from labkit.labs.common.diagnose import check_attention, check_logits, check_positions, diagnosed
from labkit.labs.common.pieces import Piece, on_its_own
from labkit.labs.common.recording import RecordingModel
from labkit.labs.common.shared import course_model, pick_prompts, transformers_logits
from labkit.labs.hints import register_hints
from labkit.labs.lab1.attention import ATTENTION
from labkit.labs.lab1.mask import MASK, course_causal_mask


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
        oracle=lambda inputs: {"logits": transformers_logits(inputs[0], tuple(inputs[1])), "prompt": list(inputs[1])},
        compare=_compare_prefill,
        tested="prefill(model, prompt) on a short prompt with the default model (with the course's causal_mask and "
        "attention in place of yours, which are checked on their own): one forward pass, positions 0..T-1, causal "
        "attention at every layer, logits [T, vocab] equal to transformers' own forward pass",
        hint="One model.forward over the whole prompt: its ids, positions 0 .. T-1, and an attend that is your attention "
        'with your causal mask, all on model.device. labkit.hint("lab1.prefill") shows more.',
    )
)
register(on_its_own(PREFILL, Piece(MASK, course_causal_mask), Piece(ATTENTION, attention)))

register_hints(
    "lab1.prefill",
    "One call to model.forward does the whole prompt. You supply the tokens, their positions 0 .. T-1, and an "
    "attend callback that is your attention with your causal mask.",
    "Make the ids and the positions as integer tensors of length T on model.device, and the T x T mask on the same "
    "device; define attend(layer, q, k, v) that returns attention(q, k, v, mask); return what model.forward gives.",
    "torch.tensor(prompt_ids, device=model.device); torch.arange(T, device=model.device); "
    "causal_mask(T).to(model.device); model.forward(ids, positions, attend).",
)
