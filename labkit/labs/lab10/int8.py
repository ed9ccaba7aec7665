"""Lab 10, exercise 1: ``quantize_int8(weight) -> (codes, scale)``, symmetric int8 with one scale per output row,
and ``dequantize_int8(codes, scale)``, the weight back from its codes."""

from __future__ import annotations

import functools
from typing import Any

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.learner_errors import capture
from labkit.labs.common.shared import on_check_device
from labkit.labs.hints import register_hints
from labkit.labs.lab10.course import course_dequantize_int8, course_quantize_int8
from labkit.labs.lab10.quantizers import (
    STEP_SLACK,
    all_zeros,
    check_codes_dtype,
    close,
    compare_dequantized,
    described,
    first_mismatch,
    plain,
    real_weights,
    rounding_mistake,
    seeded_weight,
    shape_error,
)


def int8_cases(seed: int) -> list[dict[str, Any]]:
    cases = [
        dict(name="a seeded weight with an outlier", weight=seeded_weight(seed, 48, 200)),
        dict(name="a square seeded weight", weight=seeded_weight(seed + 1, 64, 64)),
    ]
    cases += [dict(name=name, weight=w) for name, w in real_weights(seed)]
    for case in cases:
        case["course"] = course_quantize_int8(case["weight"])
    return on_check_device(cases)


def _run_int8(functions, cases) -> list[dict[str, torch.Tensor]]:
    quantize, dequantize = functions
    outs = []
    for case in cases:
        codes, scale = quantize(case["weight"].clone())
        back = capture([dequantize], lambda: plain(dequantize(*case["course"])))
        outs.append({"codes": plain(codes), "scale": plain(scale), "dequantized": back})
    return outs


def _int8_oracle(cases) -> list[dict[str, Any]]:
    return [dict(c, dequantized=course_dequantize_int8(*c["course"])) for c in cases]


def _judge_int8(case, mine) -> Mismatch | None:
    """One case, checked in the order a learner fixes things: the shapes, the scales, the codes, the way back."""
    w, where = case["weight"].double(), described(case)
    codes, scale = mine["codes"], mine["scale"]
    want = w.abs().amax(dim=1) / 127
    mistake = _codes_shape(codes, w, where) or _scale_layout(scale, w, want, where)
    if mistake is not None:
        return mistake
    mistake, scale = all_zeros(scale.flatten().double(), want, codes, where, "row")
    return (
        mistake
        or _scale_values(scale, want, where)
        or check_codes_dtype(codes, torch.int8, where, -127, 127)
        or _round_trip(w, codes, scale, where)
        or compare_dequantized(case, mine["dequantized"], where, "int8", _dequantize_mistakes)
    )


def _codes_shape(codes: torch.Tensor, w: torch.Tensor, where: str) -> Mismatch | None:
    if tuple(codes.shape) != tuple(w.shape):
        return Mismatch(f"{where}: codes of shape {list(codes.shape)}", "codes has the weight's shape: one per weight.")
    return None


def _scale_layout(scale: torch.Tensor, w: torch.Tensor, want: torch.Tensor, where: str) -> Mismatch | None:
    """One scale per row: not one for the whole weight, nor one per column."""
    rows, columns = w.shape
    if scale.numel() == 1 or (scale.numel() == rows and rows > 1 and bool((scale == scale.flatten()[0]).all())):
        return Mismatch(
            f"{where}: one scale for the whole weight ({float(scale.flatten()[0]):.3g}); expected {rows} scales, "
            f"one per row, from {float(want[want > 0].min()):.3g} to {float(want.max()):.3g}",
            "That is a per-tensor scale: one outlier then stretches every row's step. Per output channel means "
            "one scale per row of the weight: its largest |w| / 127 (amax over dim=1).",
        )
    if scale.numel() == columns and columns != rows or close(scale.flatten(), w.abs().amax(dim=0) / 127):
        return Mismatch(
            f"{where}: the scales are the columns' largest |w| / 127",
            "The weight is [out_features, in_features]; an output channel is a row. Take amax over dim=1 (each "
            "row's largest |w|), giving one scale per row.",
        )
    if scale.numel() != rows:
        return Mismatch(f"{where}: scale of shape {list(scale.shape)}, expected [{rows}]", "One scale per row.")
    return None


def _scale_values(scale: torch.Tensor, want: torch.Tensor, where: str) -> Mismatch | None:
    """Each row's largest |w| / 127, to fp16's rounding; a wrong divisor is named."""
    if close(scale, want):
        return None
    row = int((scale - want).abs().argmax())
    hint = None
    for divisor, why in ((128, "128"), (255, "255"), (256, "256")):
        if close(scale, want * 127 / divisor):
            hint = (
                f"You divided by {why}. Symmetric int8 uses the codes -127 to 127, so the largest |w| of a "
                "row must map to 127: scale = absmax / 127."
            )
    return Mismatch(
        f"{where}: row {row} has scale {float(scale[row]):.6g}, expected its largest |w| / 127 = "
        f"{float(want[row]):.6g}",
        hint,
    )


def _round_trip(w: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, where: str) -> Mismatch | None:
    """Every weight back within half a step of its row; floored or truncated codes are named."""
    columns = w.shape[1]
    exact = w / torch.where(scale > 0, scale, 1.0)[:, None]  # a row of zeros: 0, not 0 / 0
    error = (codes.double() * scale[:, None] - w).abs()
    bound = scale[:, None] * (0.5 + STEP_SLACK) + 1e-9
    if bool((error <= bound).all()):
        return None
    r, c = divmod(int((error - bound).argmax()), columns)
    return Mismatch(
        f"{where}: w[{r}, {c}] = {float(w[r, c]):.6g} comes back as {float(codes[r, c]) * float(scale[r]):.6g}, "
        f"{float(error[r, c] / scale[r]):.2f} of a step away (half a step at most)",
        rounding_mistake(codes, exact),
    )


def _dequantize_mistakes(case) -> list[tuple[torch.Tensor, str]]:
    """What typical wrong dequantizers return on labkit's codes, with the hint that names each."""
    codes, scale = (t.double() for t in case["course"])
    mistakes = [
        (
            codes / scale[:, None],
            "You divided the codes by the scale; the quantizer divided, so undo it: multiply.",
        ),
        (codes, "You returned the codes themselves: multiply each by its row's scale."),
    ]
    if codes.shape[0] == codes.shape[1]:
        mistakes.append(
            (
                codes * scale[None, :],
                "You multiplied column j by scale[j]; scale[r] belongs to row r: scale[:, None].",
            )
        )
    return mistakes


register(
    diagnosed(
        Exercise(
            id="lab10.int8",
            functions=("quantize_int8", "dequantize_int8"),
            answers=("labkit.models.quant.quantize_int8", "labkit.models.quant.dequantize_int8"),
            make_inputs=int8_cases,
            run=_run_int8,
            oracle=_int8_oracle,
            compare=functools.partial(first_mismatch, _judge_int8),
            tested="quantize_int8 on 2 seeded weights (one with an outlier, one square, each with a row of zeros) "
            "and 2 real weights of the course model (a seeded layer's o_proj and down_proj): one scale per row equal "
            "to its largest |w| / 127 (to fp16's rounding, as labkit stores it; a row of zeros may keep any "
            "scale but NaN, and its codes are 0), int8 codes in [-127, 127], every weight back within half a step; "
            "dequantize_int8 on labkit's codes gives labkit's weight",
            hint="scale = each row's largest |w| / 127; codes = round(w / scale) clamped to [-127, 127], as int8; "
            'the weight back = codes * scale, row by row. labkit.hint("lab10.int8") shows more.',
        ),
        known=shape_error,
    )
)

register_hints(
    "lab10.int8",
    "Each row of a weight (one output channel) gets its own step size, so a large weight in one row does not "
    "coarsen the others. The step is chosen so the row's largest |w| lands exactly on code 127.",
    "scale = the largest |w| of each row / 127 (shape [out]). codes = w / scale[:, None], rounded to the nearest "
    "whole number, clamped to [-127, 127], stored as torch.int8. Back: codes times scale[:, None].",
    "scale = (weight.abs().amax(dim=1) / 127).clamp(min=1e-8) (a row of zeros: codes 0, not 0 / 0); codes = "
    "torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8); return codes, scale  |  "
    "return codes.float() * scale[:, None]",
)
