"""Lab 10, exercise 2: ``quantize_int4(weight, group_size) -> (codes, scale, zero)``, 4-bit codes in groups of
columns with a scale and a zero point per group, and ``dequantize_int4(...)``, the way back; checked as int8 is."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.learner_errors import capture
from labkit.labs.common.shared import on_check_device
from labkit.labs.hints import register_hints
from labkit.labs.lab10.course import course_dequantize_int4, course_quantize_int4
from labkit.labs.lab10.quantizers import (
    STEP_SLACK,
    all_zeros,
    check_codes_dtype,
    close,
    compare_dequantized,
    described,
    first_mismatch,
    mostly,
    plain,
    real_weights,
    rounding_mistake,
    seeded_weight,
    shape_error,
)
from labkit.models.quant import GROUP_SIZE


def int4_cases(seed: int) -> list[dict[str, Any]]:
    ragged = seeded_weight(seed, 40, 320)  # 2.5 groups of 128: the last one is short
    ragged[7, :128] = ragged[7, :128].abs() + 0.01  # a group of positive weights: its range must stretch to 0
    cases = [
        dict(name="a seeded weight, 2.5 groups a row", weight=ragged, group_size=128),
        dict(name="a seeded weight in groups of 32", weight=seeded_weight(seed + 1, 24, 96), group_size=32),
    ]
    cases += [dict(name=name, weight=w, group_size=128) for name, w in real_weights(seed)]
    for case in cases:
        case["course"] = course_quantize_int4(case["weight"], case["group_size"])
    return on_check_device(cases)


def _run_int4(functions, cases) -> list[dict[str, torch.Tensor]]:
    quantize, dequantize = functions
    outs = []
    for case in cases:
        codes, scale, zero = quantize(case["weight"].clone(), case["group_size"])
        back = capture([dequantize], lambda: plain(dequantize(*case["course"], case["group_size"])))
        outs.append({"codes": plain(codes), "scale": plain(scale), "zero": plain(zero), "dequantized": back})
    return outs


def _int4_oracle(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(c, dequantized=course_dequantize_int4(*c["course"], c["group_size"])) for c in cases]


def _groups(w: torch.Tensor, size: int) -> torch.Tensor:
    """[rows, groups, size], the ragged last group padded with zeros (which a range holding 0 already holds)."""
    return F.pad(w, (0, -w.shape[1] % size)).reshape(w.shape[0], -1, size)


def _judge_int4(case, mine) -> Mismatch | None:
    """One case, checked in the order a learner fixes things: the shapes, the scales, the zero points, the codes,
    the way back."""
    w, size = case["weight"].double(), case["group_size"]
    where = f"{described(case)}, groups of {size}"
    codes, scale, zero = mine["codes"], mine["scale"], mine["zero"]
    mistake = _scale_and_zero_shapes(scale, zero, w, size, where) or _codes_shape(codes, w, size, where)
    if mistake is not None:
        return mistake
    blocks = _groups(w, size)
    low, high = blocks.amin(dim=2).clamp_max(0), blocks.amax(dim=2).clamp_min(0)
    want = (high - low) / 15
    held = _groups(codes.double(), size).abs().amax(dim=2) + zero.double().abs()  # 0 where codes and zero are
    mistake, scale = all_zeros(scale.double(), want, held, where, "group")
    if mistake is not None:
        return mistake
    if not close(scale, want):
        return _scale_mistake(w, size, scale, want, where)
    zero_d, exact_zero = zero.double(), -low / torch.where(scale > 0, scale, 1.0)
    return (
        _zero_points(zero_d, exact_zero, where)
        or check_codes_dtype(codes, torch.uint8, where, 0, 15)
        or check_codes_dtype(zero, torch.uint8, where, 0, 15, what="zero points")
        or _round_trip(w, codes, scale, zero_d, low, size, where)
        or compare_dequantized(case, mine["dequantized"], where, "int4", _dequantize_mistakes)
    )


def _scale_and_zero_shapes(scale, zero, w: torch.Tensor, size: int, where: str) -> Mismatch | None:
    rows, columns = w.shape
    groups = -(-columns // size)
    for name, value in (("scale", scale), ("zero", zero)):
        if tuple(value.shape) != (rows, groups):
            return Mismatch(
                f"{where}: {name} of shape {list(value.shape)}, expected [{rows}, {groups}]",
                _group_shape_hint(name, value, rows, columns, size),
            )
    return None


def _group_shape_hint(name: str, value: torch.Tensor, rows: int, columns: int, size: int) -> str:
    """What a scale or zero of the wrong shape shows: labkit's group size, groups down the columns, one per row,
    a whole group of padding too many, the ragged last group left out."""
    shape, groups = tuple(value.shape), -(-columns // size)
    if size != GROUP_SIZE and shape == (rows, -(-columns // GROUP_SIZE)):
        return f"Use the group_size you are given ({size} here), not {GROUP_SIZE}."
    if shape == (-(-rows // size), columns):
        return (
            f"Your groups run down the columns. A group is {size} neighbouring weights of one row (the input "
            f"features): reshape each row [in] into [groups, {size}] and take min and max over the last axis."
        )
    if value.numel() == rows:
        return (
            f"One {name} per row is int8's per-channel scheme. Here each group of {size} columns of a row "
            f"gets its own: [{rows}, {groups}]."
        )
    if shape == (rows, groups + 1) and columns % size == 0:
        return (
            f"One group too many: {columns} is a multiple of {size}, so no padding is needed, but "
            f"group_size - columns % group_size pads a whole group of zeros. Pad -columns % group_size "
            "columns (0 here)."
        )
    if shape == (rows, columns // size):
        return (
            f"The last group of a row is shorter when {columns} is not a multiple of {size}, but it is "
            f"still a group: ceil({columns} / {size}) = {groups} groups. Pad the row with zeros to whole groups."
        )
    return f"One {name} per group of {size} columns of each row: [{rows}, {groups}]."


def _codes_shape(codes: torch.Tensor, w: torch.Tensor, size: int, where: str) -> Mismatch | None:
    rows, columns = w.shape
    if tuple(codes.shape) == (rows, columns):
        return None
    hint = "codes has the weight's shape, one code per weight."
    if tuple(codes.shape) == (rows, -(-columns // size) * size):
        hint = f"Cut the padding off: codes[:, :{columns}], one code per weight of the original."
    return Mismatch(f"{where}: codes of shape {list(codes.shape)}, expected [{rows}, {columns}]", hint)


def _zero_points(zero: torch.Tensor, exact_zero: torch.Tensor, where: str) -> Mismatch | None:
    """Whole codes in [0, 15], not all 0, each round(-low / scale); round(low / scale) and truncation are named."""
    if not torch.equal(zero, zero.round()) or float(zero.min()) < 0 or float(zero.max()) > 15:
        hint = "zero = round(-low / scale)."
        if mostly(zero.remainder(256), (-exact_zero.round()).remainder(256)):  # uint8 wraps -k to 256 - k
            hint = "You wrote round(low / scale): low is 0 or below, so the zero point is round(-low / scale)."
        return Mismatch(f"{where}: zero points must be whole numbers in [0, 15]", hint)
    if not bool(zero.any()):
        return Mismatch(
            f"{where}: every zero point is 0",
            "You forgot the zero point. The codes 0..15 cover [low, high], not [0, high]: zero = round(-low / "
            "scale) is the code that stands for 0, and each code is round(w / scale) + zero.",
        )
    if bool(((zero - exact_zero).abs() <= 0.5 + STEP_SLACK).all()):
        return None
    r, g = divmod(int((zero - exact_zero).abs().argmax()), exact_zero.shape[1])
    hint = "zero = round(-low / scale), where low = min(group, 0): the code that stands for the weight 0."
    if mostly(zero, exact_zero.floor()):
        hint = (
            "Your zero points are -low / scale cut down to a whole number: converting to an integer type "
            "(.to(torch.uint8)) truncates. Round first: torch.round(-low / scale)."
        )
    return Mismatch(
        f"{where}: group {g} of row {r} has zero {int(zero[r, g])}, expected round(-low / scale) = "
        f"round({float(exact_zero[r, g]):.3f}) = {int(exact_zero[r, g].round())}",
        hint,
    )


def _round_trip(w, codes, scale, zero, low, size: int, where: str) -> Mismatch | None:
    """Every weight back within half a step of its group; a forgotten zero point, floored codes and a zero point
    rounded together with the weight are named."""
    columns = w.shape[1]
    by_column, zero_by_column, low_by_column = (
        value.repeat_interleave(size, dim=1)[:, :columns] for value in (scale, zero, low)
    )
    error = ((codes.double() - zero_by_column) * by_column - w).abs()
    bound = by_column * (0.5 + STEP_SLACK) + 1e-9
    if bool((error <= bound).all()):
        return None
    r, c = divmod(int((error - bound).argmax()), columns)
    steps = w / torch.where(by_column > 0, by_column, 1.0)
    hint = rounding_mistake(codes.double() - zero_by_column, steps)
    if mostly(codes, steps.round().clamp(0, 15)):
        hint = "You forgot to add the zero point to the codes: code = round(w / scale) + zero."
    elif mostly(codes, (steps - low_by_column / by_column.clamp_min(1e-30)).round().clamp(0, 15)):
        hint = (
            "Your codes are round((w - low) / scale): that rounds -low / scale together with w, but the zero "
            "point was rounded on its own, so (code - zero) * scale can miss by up to a whole step. "
            "code = round(w / scale) + zero."
        )
    return Mismatch(
        f"{where}: w[{r}, {c}] = {float(w[r, c]):.6g} got code {int(codes[r, c])} (exact "
        f"{float(steps[r, c] + zero_by_column[r, c]):.2f}), {float(error[r, c] / by_column[r, c]):.2f} of a "
        "step away (half at most)",
        hint,
    )


def _scale_mistake(w, size, scale, want, where) -> Mismatch:
    r, g = divmod(int(((scale - want).abs() / want.clamp_min(1e-12)).argmax()), want.shape[1])
    difference = (
        f"{where}: group {g} of row {r} has scale {float(scale[r, g]):.6g}, expected "
        f"(max(group, 0) - min(group, 0)) / 15 = {float(want[r, g]):.6g}"
    )
    blocks = _groups(w, size)
    columns = w.shape[1]
    real = torch.zeros(w.shape[0], blocks.shape[1] * size, dtype=torch.bool)
    real[:, :columns] = True
    real = real.reshape(blocks.shape)
    plain_min = torch.where(real, blocks, torch.inf).amin(dim=2)
    plain_max = torch.where(real, blocks, -torch.inf).amax(dim=2)
    absmax = torch.maximum(plain_max.abs(), plain_min.abs())
    symmetric = (
        "That is a symmetric scale. This scheme is asymmetric: scale = (high - low) / 15, and a zero point says "
        "which code stands for 0."
    )
    mistakes = [
        (
            (plain_max - plain_min) / 15,
            "Stretch each group's range to hold 0: low = min(group, 0) and high = max(group, 0). Then the weight 0 "
            "has a code of its own (the zero point), and a group that is all positive still fits.",
        ),
        (want * 15 / 16, "16 codes (0 to 15) have 15 steps between them: divide the range by 15, not 16."),
        (absmax / 7, symmetric),
        (absmax / 7.5, symmetric),
    ]
    for wrong, hint in mistakes:
        if close(scale, wrong):
            return Mismatch(difference, hint)
    return Mismatch(difference, "Per group: low = min(group, 0), high = max(group, 0), scale = (high - low) / 15.")


def _dequantize_mistakes(case) -> list[tuple[torch.Tensor, str]]:
    """What typical wrong dequantizers return on labkit's codes, with the hint that names each."""
    codes, scale, zero = (t.double() for t in case["course"])
    size, columns = case["group_size"], codes.shape[1]

    def spread(values, in_place=True):
        return (values.repeat_interleave(size, dim=1) if in_place else values.repeat(1, size))[:, :columns]

    tiled = (
        f"Each scale and zero covers {size} consecutive columns: column j belongs to group j // {size}. Use "
        "repeat_interleave (each value repeated in place), not repeat (the whole row of them tiled)."
    )
    return [
        (codes * spread(scale), "You forgot the zero point: a weight is (code - zero) * scale, not code * scale."),
        (
            (codes - spread(zero)).remainder(256) * spread(scale),
            "codes and zero are uint8, and uint8 arithmetic wraps around: a code k below its zero point gives "
            "256 - k, not -k. Convert to float before subtracting: codes.float() - zero.float().",
        ),
        ((codes + spread(zero)) * spread(scale), "The zero point is taken away, not added: (code - zero) * scale."),
        *[
            ((codes - spread(zero, zero_in_place)) * spread(scale, scale_in_place), tiled)
            for zero_in_place, scale_in_place in ((False, False), (True, False), (False, True))
        ],
    ]


register(
    diagnosed(
        Exercise(
            id="lab10.int4",
            functions=("quantize_int4", "dequantize_int4"),
            answers=("labkit.models.quant.quantize_int4", "labkit.models.quant.dequantize_int4"),
            make_inputs=int4_cases,
            run=_run_int4,
            oracle=_int4_oracle,
            compare=functools.partial(first_mismatch, _judge_int4),
            tested="quantize_int4 on 2 seeded weights (2.5 groups of 128 a row with an all-positive group; groups "
            "of 32; each with a row of zeros) and 2 real weights of the course model (a seeded layer's o_proj, 4.5 "
            "groups a row, and down_proj): a scale per group equal to (max(group, 0) - min(group, 0)) / 15 (to "
            "fp16's rounding; a group of zeros may keep any scale but NaN, and its codes and zero point are 0), "
            "zero points round(-low / scale), uint8 codes in [0, 15], every weight back within half a step; "
            "dequantize_int4 on labkit's codes gives labkit's weight",
            hint="Per group of group_size columns of a row: low = min(group, 0), high = max(group, 0), scale = (high - "
            "low) / 15, zero = round(-low / scale), code = round(w / scale) + zero clamped to [0, 15]; back: (code - "
            'zero) * scale. labkit.hint("lab10.int4") shows more.',
            points=2.0,
        ),
        known=shape_error,
    )
)

register_hints(
    "lab10.int4",
    "Sixteen codes are too few for one step per row: a group of 128 neighbouring weights gets its own step and its "
    "own zero point, so the 16 codes cover just that group's range, from its smallest to its largest weight "
    "(and 0), to within half a step (the zero point is a whole code).",
    "Pad each row with zeros to a whole number of groups and reshape to [out, groups, group_size]. low = amin over "
    "the last axis clamped to at most 0, high = amax clamped to at least 0; scale = (high - low) / 15; zero = "
    "round(-low / scale). codes = round(w / scale) + zero, clamped to [0, 15], back to [out, padded in], padding "
    "cut off, as uint8. Back: repeat_interleave the scale and zero along the columns.",
    "groups = F.pad(weight, (0, -weight.shape[1] % group_size)).reshape(weight.shape[0], -1, group_size); "
    "low = groups.amin(2).clamp(max=0); high = groups.amax(2).clamp(min=0); "
    "scale = ((high - low) / 15).clamp(min=1e-8); "
    "zero = torch.round(-low / scale); codes = (torch.round(groups / scale[..., None]) + zero[..., None])"
    ".clamp(0, 15)  |  s = scale.repeat_interleave(group_size, 1)[:, :columns]",
)
