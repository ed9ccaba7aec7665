"""Lab 10, fewer bytes and more GPUs: the checks for the learner's quantizers, quality run and fleet search.

- ``quantize_int8(weight) -> (codes, scale)`` and ``dequantize_int8(codes, scale)``: symmetric int8,
  one scale per output row. Checked on seeded weights with outliers and on real weights of the
  course model: each scale is the row's absmax / 127 and each weight comes back within half of it.
- ``quantize_int4(weight, group_size) -> (codes, scale, zero)`` and ``dequantize_int4(...)``: 4-bit
  codes in groups of ``group_size`` columns, a scale and a zero point per group. Checked the same
  way, with a ragged last group, a group that does not hold 0, and group sizes of 32 and 128.
- ``measure_quality(model, round_trips, prompts, n_tokens)``: each scheme's model built and judged
  with labkit's ``quality``. Checked on the real model with round trips named unlike labkit's schemes
  (int4 in groups of 32 or 64), against the same models built the same way (so the numbers agree to
  float noise, and the models swapped, or labkit's quantize_model used instead, show).
- ``fewest_gpus(load_per_s, inputs) -> (tensor_parallel, replicas)``: the search over splits and
  replicas with labkit's planner. Checked against ``labkit.capacity.size_fleet`` on the 10x sale,
  seeded variations of it, an exact multiple of what a replica carries, and a promise nothing keeps.
  Typical wrong replica counts (rounded down, ``int(x) + 1``, sized at the request ceiling) are
  computed for every case and named when they explain every answer.

Every quantizer check compares with :mod:`labkit.models.quant` through the adapters of
:mod:`labkit.labs.lab10.runs`, and judges the learner's numbers by what they must satisfy
(a scale within fp16's rounding of the formula, every weight within half a step), so an answer
that stores scales in fp32 rather than fp16 passes as it should.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.nn.functional as F

from labkit.capacity import SALE_70B_EXAMPLE, SALE_EXAMPLE, sale_load, size_fleet, with_precision
from labkit.capacity.parallel import LLAMA_3_1_70B
from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed, raised_mismatch
from labkit.labs.common.learner_errors import capture, raised_in
from labkit.labs.common.shared import course_model, on_check_device, rng, torch_generator
from labkit.labs.hints import register_hints
from labkit.labs.lab10.course import (
    course_dequantize_int4,
    course_dequantize_int8,
    course_quantize_int4,
    course_quantize_int8,
    course_round_trips,
)
from labkit.labs.lab10.runs import model_with_weights
from labkit.models.quant import GROUP_SIZE, quality
from labkit.workloads import sharegpt_quality_prompts

SCALE_RTOL = 1.5e-3  # fp16 keeps 10 bits: a scale rounded to it (labkit stores them so) is within 1e-3
STEP_SLACK = 1e-3  # a weight may come back up to half a step, plus this share of a step, away
ZEROS_HINT = (
    "A row (int8) or group (int4) of zeros has largest |w| 0, so scale 0, and 0 / 0 is NaN: keep the scale above 0 "
    "(.clamp(min=1e-8)) so its codes are 0 (int4: its zero point too) and it comes back as zeros."
)


def _plain(value: Any) -> torch.Tensor:
    """A learner's output as a tensor of its own on the CPU (what the grader can load back)."""
    return torch.as_tensor(value).detach().cpu().contiguous().clone()


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = SCALE_RTOL) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), rtol=rtol, atol=1e-12))


def _real_weights(seed: int) -> list[tuple[str, torch.Tensor]]:
    """Two real weights of the course model from a seeded layer: a square one and a wide one."""
    model = course_model()
    layer = rng(seed).randrange(model.config.num_layers)
    return [
        (
            f"layer {layer}'s {name} of the course model",
            model.weights[f"model.layers.{layer}.{path}.weight"].float().cpu(),
        )
        for name, path in (("o_proj", "self_attn.o_proj"), ("down_proj", "mlp.down_proj"))
    ]


def _seeded_weight(seed: int, rows: int, columns: int) -> torch.Tensor:
    w = torch.randn(rows, columns, generator=torch_generator(seed)) * 0.05
    w[rows // 3, columns // 4] = 1.5  # an outlier widens its own row (int8) and its own group (int4)
    w[-1] = 0  # a row of zeros (a pruned channel): scale 0, unless kept above it, and no NaN codes
    return w


def _all_zeros(scale: torch.Tensor, want: torch.Tensor, held: torch.Tensor, where: str, part: str):
    """The parts (rows or groups) of zeros, where ``want`` is 0: any scale but NaN or a negative one is right there
    (0, or what a clamp keeps above it), and is judged as 0 from here on; ``held`` (codes, and int4's zero points)
    must be 0 there, so the part comes back as zeros. Returns (a Mismatch or None, the scale to judge)."""
    zeros = want == 0
    bad = zeros & ~(scale >= 0)
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        which = f"{part} {index[-1]}" + (f" of row {index[0]}" if len(index) == 2 else "")
        return Mismatch(f"{where}: {which} is all zeros and has scale {float(scale[index]):.3g}", ZEROS_HINT), scale
    if bool((held.double().nan_to_num(1.0)[zeros] != 0).any()):
        return Mismatch(
            f"{where}: a {part} of zeros does not come back as zeros (its codes are not 0)", ZEROS_HINT
        ), scale
    return None, torch.where(zeros, 0.0, scale)


def _where(case: dict[str, Any]) -> str:
    rows, columns = case["weight"].shape
    return f"{case['name']} ([{rows}, {columns}])"


# --- lab10.int8 -------------------------------------------------------------------------------


def int8_cases(seed: int) -> list[dict[str, Any]]:
    cases = [
        dict(name="a seeded weight with an outlier", weight=_seeded_weight(seed, 48, 200)),
        dict(name="a square seeded weight", weight=_seeded_weight(seed + 1, 64, 64)),
    ]
    cases += [dict(name=name, weight=w) for name, w in _real_weights(seed)]
    for case in cases:
        case["course"] = course_quantize_int8(case["weight"])
    return on_check_device(cases)


def _run_int8(functions, cases) -> list[dict[str, torch.Tensor]]:
    quantize, dequantize = functions
    outs = []
    for case in cases:
        codes, scale = quantize(case["weight"].clone())
        back = capture([dequantize], lambda: _plain(dequantize(*case["course"])))
        outs.append({"codes": _plain(codes), "scale": _plain(scale), "dequantized": back})
    return outs


def _int8_oracle(cases) -> list[dict[str, Any]]:
    return [
        {
            "name": c["name"],
            "weight": c["weight"],
            "course": c["course"],
            "dequantized": course_dequantize_int8(*c["course"]),
        }
        for c in cases
    ]


def _mostly(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` equals ``b`` almost everywhere: a rule followed, but for the few codes a clamp moved."""
    return a.shape == b.shape and float((a.double() == b.double()).double().mean()) > 0.99


def _rounding_mistake(codes: torch.Tensor, exact: torch.Tensor) -> str | None:
    """A hint if the codes are the exact quotients floored or truncated instead of rounded."""
    codes = codes.double()
    if _mostly(codes, exact.floor()):
        return (
            "Your codes are floor(w / scale): flooring moves every weight down, up to a whole step. Round to the "
            "nearest code (torch.round) so no weight moves more than half a step."
        )
    if _mostly(codes, exact.trunc()):
        return (
            "Your codes are w / scale cut toward zero: converting to an integer type (.to(torch.int8)) truncates. "
            "Round first (torch.round), then convert."
        )
    return None


def _check_codes_dtype(
    codes: torch.Tensor, dtype: torch.dtype, where: str, low: int, high: int, what: str = "codes"
) -> Mismatch | None:
    if codes.is_floating_point() and not torch.equal(codes, codes.round()):
        fraction = float(codes[codes != codes.round()][0])
        return Mismatch(
            f"{where}: the {what} are not whole numbers (for example {fraction:.3f})",
            ZEROS_HINT
            if math.isnan(fraction)
            else "A code is a whole number: round to the nearest integer (torch.round) before storing it.",
        )
    if codes.numel() and (int(codes.min()) < low or int(codes.max()) > high):
        return Mismatch(
            f"{where}: the {what} run from {int(codes.min())} to {int(codes.max())}, outside [{low}, {high}]",
            f"Clamp them to [{low}, {high}] (torch.clamp) before storing them.",
        )
    if codes.dtype != dtype:
        return Mismatch(
            f"{where}: the {what} are {codes.dtype}, expected {dtype}",
            f"The bytes are the point: store them as {dtype} (.to({dtype})), one byte each, not 4 or 8.",
        )
    return None


def _compare_int8(expected, got) -> Mismatch | None:
    for case, mine in zip(expected, got):
        w, where = case["weight"].double(), _where(case)
        rows, columns = w.shape
        codes, scale = mine["codes"], mine["scale"]
        if tuple(codes.shape) != (rows, columns):
            return Mismatch(
                f"{where}: codes of shape {list(codes.shape)}", "codes has the weight's shape: one per weight."
            )
        want = w.abs().amax(dim=1) / 127
        if scale.numel() == 1 or (scale.numel() == rows and rows > 1 and bool((scale == scale.flatten()[0]).all())):
            return Mismatch(
                f"{where}: one scale for the whole weight ({float(scale.flatten()[0]):.3g}); expected {rows} scales, "
                f"one per row, from {float(want[want > 0].min()):.3g} to {float(want.max()):.3g}",
                "That is a per-tensor scale: one outlier then stretches every row's step. Per output channel means "
                "one scale per row of the weight: its largest |w| / 127 (amax over dim=1).",
            )
        if scale.numel() == columns and columns != rows or _close(scale.flatten(), w.abs().amax(dim=0) / 127):
            return Mismatch(
                f"{where}: the scales are the columns' largest |w| / 127",
                "The weight is [out_features, in_features]; an output channel is a row. Take amax over dim=1 (each "
                "row's largest |w|), giving one scale per row.",
            )
        if scale.numel() != rows:
            return Mismatch(f"{where}: scale of shape {list(scale.shape)}, expected [{rows}]", "One scale per row.")
        mistake, scale = _all_zeros(scale.flatten().double(), want, codes, where, "row")
        if mistake is not None:
            return mistake
        if not _close(scale, want):
            row = int((scale - want).abs().argmax())
            hint = None
            for divisor, why in ((128, "128"), (255, "255"), (256, "256")):
                if _close(scale, want * 127 / divisor):
                    hint = (
                        f"You divided by {why}. Symmetric int8 uses the codes -127 to 127, so the largest |w| of a "
                        "row must map to 127: scale = absmax / 127."
                    )
            return Mismatch(
                f"{where}: row {row} has scale {float(scale[row]):.6g}, expected its largest |w| / 127 = "
                f"{float(want[row]):.6g}",
                hint,
            )
        mistake = _check_codes_dtype(codes, torch.int8, where, -127, 127)
        if mistake is not None:
            return mistake
        exact = w / torch.where(scale > 0, scale, 1.0)[:, None]  # a row of zeros: 0, not 0 / 0
        error = (codes.double() * scale[:, None] - w).abs()
        bound = scale[:, None] * (0.5 + STEP_SLACK) + 1e-9
        if not bool((error <= bound).all()):
            r, c = divmod(int((error - bound).argmax()), columns)
            return Mismatch(
                f"{where}: w[{r}, {c}] = {float(w[r, c]):.6g} comes back as {float(codes[r, c]) * float(scale[r]):.6g}, "
                f"{float(error[r, c] / scale[r]):.2f} of a step away (half a step at most)",
                _rounding_mistake(codes, exact),
            )
        mistake = _compare_dequantized(case, mine["dequantized"], where, "int8")
        if mistake is not None:
            return mistake
    return None


def _compare_dequantized(case, mine: Any, where: str, scheme: str) -> Mismatch | None:
    """The learner's dequantizer on labkit's codes, judged once their quantizer's own outputs passed (so a
    quantizer's mistake is named first, even when the dequantizer written to match it fails on labkit's codes)."""
    record = raised_in(mine)
    if record is not None:
        return raised_mismatch(record, _shape_error(record))
    want = case["dequantized"]
    if mine.shape == want.shape and bool(torch.allclose(mine.double(), want.double(), rtol=1e-5, atol=1e-7)):
        return None
    difference = f"{where}: dequantize_{scheme} of labkit's codes gave back another weight than labkit's"
    if mine.shape != want.shape:
        return Mismatch(f"{where}: dequantize_{scheme} returned shape {list(mine.shape)}, expected {list(want.shape)}")
    r, c = divmod(int((mine.double() - want.double()).abs().argmax()), want.shape[1])
    difference += f" (at [{r}, {c}]: {float(mine[r, c]):.6g}, expected {float(want[r, c]):.6g})"
    for wrong, hint in _dequantize_mistakes(case, scheme):
        if wrong.shape == mine.shape and bool(torch.allclose(mine.double(), wrong.double(), rtol=1e-5, atol=1e-7)):
            return Mismatch(difference, hint)
    return Mismatch(difference, "A weight is its code times its scale (after taking away the zero point, in int4).")


def _dequantize_mistakes(case, scheme: str) -> list[tuple[torch.Tensor, str]]:
    """What typical wrong dequantizers return on labkit's codes, with the hint that names each."""
    if scheme == "int8":
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


def _shape_error(record: dict[str, Any]) -> str | None:
    """A hint for the broadcasting error of a scale laid along the wrong axis."""
    if "must match the size of tensor" in record["message"] or "shape" in record["message"]:
        return (
            "The shapes do not line up. A weight and its codes are [out, in]; a per-row value (int8's scale) is "
            "[out] and multiplies as scale[:, None], one column that spreads along each row; int4's scale and zero "
            "are [out, groups] and spread over each group's columns."
        )
    return None


register(
    diagnosed(
        Exercise(
            id="lab10.int8",
            functions=("quantize_int8", "dequantize_int8"),
            answers=("labkit.models.quant.quantize_int8", "labkit.models.quant.dequantize_int8"),
            make_inputs=int8_cases,
            run=_run_int8,
            oracle=_int8_oracle,
            compare=_compare_int8,
            tested="quantize_int8 on 2 seeded weights (one with an outlier, one square, each with a row of zeros) "
            "and 2 real weights of the course model (a seeded layer's o_proj and down_proj): one scale per row equal "
            "to its largest |w| / 127 (to fp16's rounding, as labkit stores it; a row of zeros may keep any "
            "scale but NaN, and its codes are 0), int8 codes in [-127, 127], every weight back within half a step; "
            "dequantize_int8 on labkit's codes gives labkit's weight",
            hint="scale = each row's largest |w| / 127; codes = round(w / scale) clamped to [-127, 127], as int8; "
            'the weight back = codes * scale, row by row. labkit.hint("lab10.int8") shows more.',
        ),
        known=_shape_error,
    )
)

# --- lab10.int4 -------------------------------------------------------------------------------


def int4_cases(seed: int) -> list[dict[str, Any]]:
    ragged = _seeded_weight(seed, 40, 320)  # 2.5 groups of 128: the last one is short
    ragged[7, :128] = ragged[7, :128].abs() + 0.01  # a group of positive weights: its range must stretch to 0
    cases = [
        dict(name="a seeded weight, 2.5 groups a row", weight=ragged, group_size=128),
        dict(name="a seeded weight in groups of 32", weight=_seeded_weight(seed + 1, 24, 96), group_size=32),
    ]
    cases += [dict(name=name, weight=w, group_size=128) for name, w in _real_weights(seed)]
    for case in cases:
        case["course"] = course_quantize_int4(case["weight"], case["group_size"])
    return on_check_device(cases)


def _run_int4(functions, cases) -> list[dict[str, torch.Tensor]]:
    quantize, dequantize = functions
    outs = []
    for case in cases:
        codes, scale, zero = quantize(case["weight"].clone(), case["group_size"])
        back = capture([dequantize], lambda: _plain(dequantize(*case["course"], case["group_size"])))
        outs.append({"codes": _plain(codes), "scale": _plain(scale), "zero": _plain(zero), "dequantized": back})
    return outs


def _int4_oracle(cases) -> list[dict[str, Any]]:
    return [
        {
            "name": c["name"],
            "weight": c["weight"],
            "group_size": c["group_size"],
            "course": c["course"],
            "dequantized": course_dequantize_int4(*c["course"], c["group_size"]),
        }
        for c in cases
    ]


def _groups(w: torch.Tensor, size: int) -> torch.Tensor:
    """[rows, groups, size], the ragged last group padded with zeros (which a range holding 0 already holds)."""
    return F.pad(w, (0, -w.shape[1] % size)).reshape(w.shape[0], -1, size)


def _compare_int4(expected, got) -> Mismatch | None:
    for case, mine in zip(expected, got):
        w, size, where = case["weight"].double(), case["group_size"], _where(case)
        rows, columns = w.shape
        groups = -(-columns // size)
        where += f", groups of {size}"
        codes, scale, zero = mine["codes"], mine["scale"], mine["zero"]
        for name, value in (("scale", scale), ("zero", zero)):
            if tuple(value.shape) == (rows, groups):
                continue
            if size != GROUP_SIZE and tuple(value.shape) == (rows, -(-columns // GROUP_SIZE)):
                hint = f"Use the group_size you are given ({size} here), not {GROUP_SIZE}."
            elif tuple(value.shape) == (-(-rows // size), columns):
                hint = (
                    f"Your groups run down the columns. A group is {size} neighbouring weights of one row (the input "
                    f"features): reshape each row [in] into [groups, {size}] and take min and max over the last axis."
                )
            elif value.numel() == rows:
                hint = (
                    f"One {name} per row is int8's per-channel scheme. Here each group of {size} columns of a row "
                    f"gets its own: [{rows}, {groups}]."
                )
            elif tuple(value.shape) == (rows, groups + 1) and columns % size == 0:
                hint = (
                    f"One group too many: {columns} is a multiple of {size}, so no padding is needed, but "
                    f"group_size - columns % group_size pads a whole group of zeros. Pad -columns % group_size "
                    "columns (0 here)."
                )
            elif tuple(value.shape) == (rows, columns // size):
                hint = (
                    f"The last group of a row is shorter when {columns} is not a multiple of {size}, but it is "
                    f"still a group: ceil({columns} / {size}) = {groups} groups. Pad the row with zeros to whole groups."
                )
            else:
                hint = f"One {name} per group of {size} columns of each row: [{rows}, {groups}]."
            return Mismatch(f"{where}: {name} of shape {list(value.shape)}, expected [{rows}, {groups}]", hint)
        if tuple(codes.shape) != (rows, columns):
            hint = "codes has the weight's shape, one code per weight."
            if tuple(codes.shape) == (rows, groups * size):
                hint = f"Cut the padding off: codes[:, :{columns}], one code per weight of the original."
            return Mismatch(f"{where}: codes of shape {list(codes.shape)}, expected [{rows}, {columns}]", hint)
        blocks = _groups(w, size)
        low, high = blocks.amin(dim=2).clamp_max(0), blocks.amax(dim=2).clamp_min(0)
        want = (high - low) / 15
        held = _groups(codes.double(), size).abs().amax(dim=2) + zero.double().abs()  # 0 where codes and zero are
        mistake, scale = _all_zeros(scale.double(), want, held, where, "group")
        if mistake is not None:
            return mistake
        if not _close(scale, want):
            return _int4_scale_mistake(w, size, scale, want, where)
        zero_d, exact_zero = zero.double(), -low / torch.where(scale > 0, scale, 1.0)
        if not torch.equal(zero_d, zero_d.round()) or float(zero_d.min()) < 0 or float(zero_d.max()) > 15:
            hint = "zero = round(-low / scale)."
            if _mostly(zero_d.remainder(256), (-exact_zero.round()).remainder(256)):  # uint8 wraps -k to 256 - k
                hint = "You wrote round(low / scale): low is 0 or below, so the zero point is round(-low / scale)."
            return Mismatch(f"{where}: zero points must be whole numbers in [0, 15]", hint)
        if not bool(zero_d.any()):
            return Mismatch(
                f"{where}: every zero point is 0",
                "You forgot the zero point. The codes 0..15 cover [low, high], not [0, high]: zero = round(-low / "
                "scale) is the code that stands for 0, and each code is round(w / scale) + zero.",
            )
        if not bool(((zero_d - exact_zero).abs() <= 0.5 + STEP_SLACK).all()):
            r, g = divmod(int((zero_d - exact_zero).abs().argmax()), groups)
            hint = "zero = round(-low / scale), where low = min(group, 0): the code that stands for the weight 0."
            if _mostly(zero_d, exact_zero.floor()):
                hint = (
                    "Your zero points are -low / scale cut down to a whole number: converting to an integer type "
                    "(.to(torch.uint8)) truncates. Round first: torch.round(-low / scale)."
                )
            return Mismatch(
                f"{where}: group {g} of row {r} has zero {int(zero_d[r, g])}, expected round(-low / scale) = "
                f"round({float(exact_zero[r, g]):.3f}) = {int(exact_zero[r, g].round())}",
                hint,
            )
        mistake = _check_codes_dtype(codes, torch.uint8, where, 0, 15) or _check_codes_dtype(
            zero, torch.uint8, where, 0, 15, what="zero points"
        )
        if mistake is not None:
            return mistake
        by_column, zero_by_column, low_by_column = (
            value.repeat_interleave(size, dim=1)[:, :columns] for value in (scale, zero_d, low)
        )
        error = ((codes.double() - zero_by_column) * by_column - w).abs()
        bound = by_column * (0.5 + STEP_SLACK) + 1e-9
        if not bool((error <= bound).all()):
            r, c = divmod(int((error - bound).argmax()), columns)
            steps = w / torch.where(by_column > 0, by_column, 1.0)
            hint = _rounding_mistake(codes.double() - zero_by_column, steps)
            if _mostly(codes, steps.round().clamp(0, 15)):
                hint = "You forgot to add the zero point to the codes: code = round(w / scale) + zero."
            elif _mostly(codes, (steps - low_by_column / by_column.clamp_min(1e-30)).round().clamp(0, 15)):
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
        mistake = _compare_dequantized(case, mine["dequantized"], where, "int4")
        if mistake is not None:
            return mistake
    return None


def _int4_scale_mistake(w, size, scale, want, where) -> Mismatch:
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
    mistakes = [
        (
            (plain_max - plain_min) / 15,
            "Stretch each group's range to hold 0: low = min(group, 0) and high = max(group, 0). Then the weight 0 "
            "has a code of its own (the zero point), and a group that is all positive still fits.",
        ),
        (want * 15 / 16, "16 codes (0 to 15) have 15 steps between them: divide the range by 15, not 16."),
        (
            absmax / 7,
            "That is a symmetric scale. This scheme is asymmetric: scale = (high - low) / 15, and a zero point says "
            "which code stands for 0.",
        ),
        (
            absmax / 7.5,
            "That is a symmetric scale. This scheme is asymmetric: scale = (high - low) / 15, and a zero point says "
            "which code stands for 0.",
        ),
    ]
    for wrong, hint in mistakes:
        if _close(scale, wrong):
            return Mismatch(difference, hint)
    return Mismatch(difference, "Per group: low = min(group, 0), high = max(group, 0), scale = (high - low) / 15.")


register(
    diagnosed(
        Exercise(
            id="lab10.int4",
            functions=("quantize_int4", "dequantize_int4"),
            answers=("labkit.models.quant.quantize_int4", "labkit.models.quant.dequantize_int4"),
            make_inputs=int4_cases,
            run=_run_int4,
            oracle=_int4_oracle,
            compare=_compare_int4,
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
        known=_shape_error,
    )
)

# --- lab10.quality ----------------------------------------------------------------------------

QUALITY_PROMPTS = 1  # a check of the plumbing, not a quality study: the notebook measures more
QUALITY_TOKENS = 8
QUALITY_PROMPT_TOKENS = 48  # each call of quality reads the prompt three times; short keeps the check quick
QUALITY_GROUPS = (32, 64)  # the check's 4-bit groups: not labkit's 128, so quantize_model(model, "int4") shows


def quality_prompts(seed: int) -> list[list[dict]]:
    """``QUALITY_PROMPTS`` of the fixed quality prompts (cut to 48 tokens), picked by the seed."""
    every = sharegpt_quality_prompts(course_model().tokenizer, max_prompt_tokens=QUALITY_PROMPT_TOKENS)
    return rng(seed).sample(every, QUALITY_PROMPTS)


def quality_inputs(seed: int) -> dict[str, Any]:
    return {
        "prompts": quality_prompts(seed),
        "n_tokens": QUALITY_TOKENS,
        "group_size": rng(seed).choice(QUALITY_GROUPS),
        "seed": seed,
    }


def quality_round_trips(group_size: int) -> dict[str, Any]:
    """The round trips the check hands over: labkit's int8, and its 4-bit in groups of ``group_size``, named so."""
    trips = course_round_trips(group_size)
    return {"int8": trips["int8"], f"int4-g{group_size}": trips["int4"]}


def _run_quality(functions, inputs) -> dict[str, Any]:
    trips = quality_round_trips(inputs["group_size"])
    measured = functions[0](course_model(), trips, inputs["prompts"], inputs["n_tokens"])
    if not isinstance(measured, dict):
        return {"returned": f"a {type(measured).__name__}"}
    others = {scheme: result for scheme, result in measured.items() if not hasattr(result, "mean_kl")}
    if others:
        scheme, result = next(iter(others.items()))
        return {"returned": f"a dict whose {scheme!r} is a {type(result).__name__} ({result!r:.40})"}
    return {"results": {str(s): [float(r.agreement), float(r.mean_kl)] for s, r in measured.items()}}


def _measured(seed: int, reversed_: bool) -> dict[str, list[float]]:
    """quality of each check round trip's model, built as the learner builds it; ``reversed_``: the two swapped."""
    inputs, model = quality_inputs(seed), course_model()
    out = {}
    for scheme, trip in quality_round_trips(inputs["group_size"]).items():
        pair = (model, model_with_weights(model, trip))
        measured = quality(*(pair[::-1] if reversed_ else pair), inputs["prompts"], QUALITY_TOKENS)
        out[scheme] = [measured.agreement, measured.mean_kl]
    return out


@functools.lru_cache(maxsize=4)
def _quality_oracle_for(seed: int) -> dict[str, Any]:
    """Built the learner's way (model_with_weights on the same round trips), so the numbers must agree nearly
    exactly; and with the two models swapped, the typical mistake (the KL the wrong way round)."""
    return {
        "results": _measured(seed, False),
        "reversed": _measured(seed, True),
        "positions": QUALITY_PROMPTS * QUALITY_TOKENS,
    }


def _same(mine: list[float], want: list[float], positions: int) -> bool:
    """Equal but for float noise: agreement to the position, KL to 0.1% (a thread count can move the last bits)."""
    return abs(mine[0] - want[0]) < 0.5 / positions and abs(mine[1] - want[1]) <= 1e-3 * abs(want[1]) + 1e-7


def _compare_quality(expected, got) -> Mismatch | None:
    if "returned" in got:
        return Mismatch(
            f"measure_quality returned {got['returned']}",
            "Return a dict, each scheme's name to what quality(model, quantized, prompts, n_tokens) returns "
            "(a Quality, with .agreement and .mean_kl), not a number taken from it.",
        )
    want, got, positions = expected["results"], got["results"], expected["positions"]
    if set(got) != set(want):
        return Mismatch(
            f"measure_quality returned the schemes {sorted(got)}, expected {sorted(want)}",
            "Return one entry per scheme of round_trips, under the same name as in round_trips.",
        )
    for scheme, (agreement, kl) in got.items():
        if agreement == 1 and kl == 0:
            return Mismatch(
                f"{scheme}: agreement 100% and KL 0, labkit measures {want[scheme][0]:.1%} and {want[scheme][1]:.4f}",
                "You compared the model with itself: pass quality the original first, then the model built from the "
                "round trip.",
            )
    if len({tuple(v) for v in got.values()}) == 1:
        first = next(iter(got.values()))
        return Mismatch(
            f"every scheme measured the same: agreement {first[0]:.1%}, KL {first[1]:.4f}",
            "Every scheme got the same model. Build one model per scheme inside the loop, from that scheme's round "
            "trip; a lambda written in a loop reads the loop variable when it is called, not when it was written.",
        )
    for scheme, mine in got.items():
        if _same(mine, want[scheme], positions):
            continue
        difference = (
            f"{scheme}: agreement {mine[0]:.1%} and KL {mine[1]:.5g}; the model built from this round trip "
            f"measures {want[scheme][0]:.1%} and {want[scheme][1]:.5g} on the same prompts"
        )
        if _same(mine, expected["reversed"][scheme], positions):
            return Mismatch(
                difference + ": yours are quality(quantized, model, ...), the two models the wrong way round",
                "The original comes first: its greedy tokens are the reference and the KL is KL(original || "
                "quantized), which is not symmetric. Call quality(model, quantized, prompts, n_tokens).",
            )
        return Mismatch(
            difference,
            "Build each model with model_with_weights(model, round_trip) from the round trip you were given, then "
            "call quality(model, quantized, prompts, n_tokens) with the prompts and n_tokens you were given.",
        )
    return None


def _quality_error(record: dict[str, Any]) -> str | None:
    if "quantize_model" in record["code"] or "unknown quantization scheme" in record["message"]:
        return (
            "quantize_model builds labkit's own quantized model, not the one your round trips make (and it knows "
            "only 'int8' and 'int4'): measure the round trips you are given, model_with_weights(model, round_trip)."
        )
    return None


register(
    diagnosed(
        Exercise(
            id="lab10.quality",
            functions=("measure_quality",),
            make_inputs=quality_inputs,
            run=_run_quality,
            oracle=lambda inputs: _quality_oracle_for(inputs["seed"]),
            compare=_compare_quality,
            tested="measure_quality on the course model with two round trips, labkit's int8 and its 4-bit in seeded "
            f"groups of 32 or 64 ('int4-g32' or 'int4-g64'), on a seeded ShareGPT prompt (cut to "
            f"{QUALITY_PROMPT_TOKENS} tokens) x {QUALITY_TOKENS} tokens: each scheme's Quality equals (to float noise) "
            "labkit's quality of the original against the model built from that round trip",
            hint="For each scheme: build the model with model_with_weights(model, round_trip), then "
            'quality(model, that_model, prompts, n_tokens). labkit.hint("lab10.quality") shows more.',
        ),
        known=_quality_error,
    )
)

# --- lab10.fleet ------------------------------------------------------------------------------

SPLITS = (1, 2, 4, 8)
# Loads of the 8B bot that are exactly k of its one-card replicas' worth (sale_load(k) / that replica's load is k
# in floats too), and where int(x) + 1 in place of a ceiling changes the fewest GPUs.
EXACT_MULTIPLES = (3, 5, 9, 13, 17)


def fleet_cases(seed: int) -> list[dict[str, Any]]:
    """The 10x sale of the 70B bot, then seeded loads on other cards, with int4 weights, for the 8B bot, an
    exact multiple of what one replica of the 8B bot carries, and a promise no split keeps (the answer: None)."""
    r = rng(seed)
    exact = r.choice(EXACT_MULTIPLES)
    return [
        dict(name="the 70B bot, a 10x sale", load=sale_load(10), inputs=dict(SALE_70B_EXAMPLE)),
        dict(
            name="the 70B bot on H100s",
            load=sale_load(r.uniform(3, 12)),
            inputs=dict(SALE_70B_EXAMPLE, hardware="h100-sxm"),
        ),
        dict(
            name="the 70B bot with int4 weights",
            load=sale_load(r.uniform(4, 12)),
            inputs=dict(SALE_70B_EXAMPLE, model=with_precision(LLAMA_3_1_70B, weights="int4")),
        ),
        dict(
            name="the 8B bot on H200s",
            load=sale_load(r.uniform(5, 25)),
            inputs=dict(SALE_EXAMPLE, hardware="h200"),
        ),
        dict(name=f"the 8B bot, exactly {exact} cards' worth", load=sale_load(exact), inputs=dict(SALE_EXAMPLE)),
        dict(name="the 8B bot under a 3 ms promise", load=sale_load(1), inputs=dict(SALE_EXAMPLE, promise_s=0.003)),
    ]


def _run_fleet(functions, cases) -> list[list[int] | None]:
    answers = []
    for case in cases:
        answer = functions[0](case["load"], dict(case["inputs"]))
        answers.append(None if answer is None else [int(x) for x in answer])
    return answers


# The typical wrong replica counts, as (load, one replica's plan) -> replicas, and the hint that names each.
WRONG_REPLICAS = {
    "rounded down": (
        lambda load, replica: math.floor(load / replica.promise_load_per_s),
        "You rounded the replicas down (int() or //): a load of 3.4 replicas' worth needs 4 of them. Round up: "
        "math.ceil(load_per_s / promise_load_per_s).",
    ),
    "int + 1": (
        lambda load, replica: int(load / replica.promise_load_per_s) + 1,
        "int(x) + 1 is not a ceiling: when the load is an exact multiple of what one replica carries, it rents "
        "one replica too many. Use math.ceil(load_per_s / promise_load_per_s).",
    ),
    "request ceiling": (
        lambda load, replica: math.ceil(load / replica.request_ceiling_per_s),
        "Size by promise_load_per_s, not the request ceiling: at the ceiling users wait far longer than the "
        "promise between tokens.",
    ),
}


def _fleet_oracle(cases) -> list[dict[str, Any]]:
    expected = []
    for case in cases:
        try:
            sizing = size_fleet(case["load"], **case["inputs"])
        except ValueError as error:  # no split keeps the promise: no fleet does
            expected.append({"name": case["name"], "load": case["load"], "needed": {}, "why_none": str(error)})
            continue
        fits = [o for o in sizing.options if o.plan is not None]
        variants = {}
        for name, (replicas, _) in WRONG_REPLICAS.items():
            counts = {o.tensor_parallel: replicas(case["load"], o.plan) for o in fits}
            variants[name] = {"replicas": counts, "fewest": min(n * r for n, r in counts.items())}
        expected.append(
            {
                "name": case["name"],
                "load": case["load"],
                "needed": {o.tensor_parallel: o.replicas for o in fits},
                "carried": {o.tensor_parallel: _carried(o.plan) for o in fits},
                "fewest": min(o.gpus for o in fits),
                "variants": variants,
                "why_not": {o.tensor_parallel: o.why_not for o in sizing.options if o.plan is None},
            }
        )
    return expected


def _carried(replica) -> float:
    return replica.request_ceiling_per_s if replica.promise_load_per_s is None else replica.promise_load_per_s


def _wrong_rule(expected, got) -> str | None:
    """The typical wrong replica count that gives every one of the learner's answers, if one does."""
    pairs = [(case, answer) for case, answer in zip(expected, got) if case["needed"]]
    for name in WRONG_REPLICAS:
        variants = [(case["variants"][name], answer) for case, answer in pairs]
        if all(v["replicas"].get(n) == r and n * r == v["fewest"] for v, (n, r) in variants):
            return name
    return None


def _compare_fleet(expected, got) -> Mismatch | None:
    for case, answer in zip(expected, got):
        where = f"{case['name']}, {case['load']:.1f} requests/s"
        if not case["needed"]:
            if answer is not None:
                return Mismatch(
                    f"{where}: you returned {answer}, but no split keeps this promise ({case['why_none']})",
                    "When plan raises ValueError for every split, no fleet keeps the promise: return None.",
                )
            continue
        if answer is None:
            return Mismatch(
                f"{where}: fewest_gpus returned None, but {case['fewest']} GPUs carry it",
                "Return None only when every split raises ValueError; here some split keeps the promise.",
            )
        if len(answer) != 2:
            return Mismatch(
                f"{where}: fewest_gpus returned {answer}", "Return two numbers: (tensor_parallel, replicas)."
            )
        ways, replicas = answer
        if ways not in case["needed"]:
            why = case["why_not"].get(ways, f"tensor_parallel must be one of {SPLITS}")
            return Mismatch(f"{where}: tensor_parallel={ways} is not a plan that works here: {why}")
    rule = _wrong_rule(expected, got)
    for case, answer in zip(expected, got):
        if not case["needed"]:
            continue
        (ways, replicas), where, needed = answer, f"{case['name']}, {case['load']:.1f} requests/s", case["needed"]
        want = needed[ways]
        if replicas != want:
            carried = case["carried"][ways]
            return Mismatch(
                f"{where}: with {ways} GPU{'s' if ways > 1 else ''} a replica carries {carried:.2f} requests/s within the promise, so it "
                f"takes ceil({case['load']:.2f} / {carried:.2f}) = {want} replicas; you said {replicas}",
                WRONG_REPLICAS[rule][1]
                if rule
                else "The replicas are ceil(load / what one replica carries within the promise).",
            )
        if ways * replicas != case["fewest"]:
            best = min(needed, key=lambda n: n * needed[n])
            return Mismatch(
                f"{where}: {ways} x {replicas} = {ways * replicas} GPUs, but {best} x {needed[best]} = "
                f"{case['fewest']} GPUs carry it too",
                WRONG_REPLICAS[rule][1]
                if rule
                else "Try every split (1, 2, 4 and 8 GPUs a replica), count each fleet's GPUs (N x replicas: a "
                "replica of N GPUs costs N) and keep the fewest.",
            )
    return None


def _fleet_error(record: dict[str, Any]) -> str | None:
    if record["error"] == "ValueError" and any(
        words in record["message"] for words in ("do not fit", "not one conversation", "cannot share", "no load keeps")
    ):
        return (
            "plan raises ValueError for a split where the model does not fit (the 70B weights on one card) or no "
            "load keeps the promise. That split is simply not an option: catch the error (try / except "
            "ValueError) and go on to the next; if every split raises, return None."
        )
    return None


register(
    diagnosed(
        Exercise(
            id="lab10.fleet",
            functions=("fewest_gpus",),
            make_inputs=fleet_cases,
            run=_run_fleet,
            oracle=_fleet_oracle,
            compare=_compare_fleet,
            tested="fewest_gpus on the 10x sale of the 70B bot, 3 seeded loads (70B on H100s, 70B with int4 "
            "weights, 8B on H200s) and a load of the 8B bot that is an exact multiple of what one replica carries, "
            "under the 50 ms promise, and the 8B bot under a 3 ms promise no split keeps (None): as few GPUs in all "
            "as labkit.capacity.size_fleet finds (any split of that many), with just enough replicas for the split "
            "chosen",
            hint="For each split N in (1, 2, 4, 8): plan(**inputs, tensor_parallel=N) (skip it if that raises "
            "ValueError), replicas = ceil(load / promise_load_per_s); keep the fewest N x replicas. "
            'labkit.hint("lab10.fleet") shows more.',
        ),
        known=_fleet_error,
    )
)

# --- hints, from the idea to near-code (labkit.hint) ------------------------------------------

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
register_hints(
    "lab10.quality",
    "A round trip (quantize, then dequantize) gives the weight a quantized layer really multiplies by. Build the "
    "model from it and compare its next-token choices with the original's.",
    "For each scheme, round_trip in round_trips.items(): quantized = model_with_weights(model, round_trip); "
    "results[scheme] = quality(model, quantized, prompts, n_tokens). Return results.",
    "return {scheme: quality(model, model_with_weights(model, trip), prompts, n_tokens) "
    "for scheme, trip in round_trips.items()}",
)
register_hints(
    "lab10.fleet",
    "A split that fits gives a replica; the promise says how many requests/s one replica carries; the load says "
    "how many replicas. Of all the splits, the cheapest fleet is the one with the fewest GPUs.",
    "For N in (1, 2, 4, 8): try p = plan(**inputs, tensor_parallel=N), except ValueError: skip N. replicas = "
    "math.ceil(load_per_s / p.promise_load_per_s). Keep the (N, replicas) with the smallest N * replicas.",
    "best = None; for n in (1, 2, 4, 8): try: p = plan(**inputs, tensor_parallel=n) except ValueError: continue; "
    "r = math.ceil(load_per_s / p.promise_load_per_s); if best is None or n * r < best[0] * best[1]: best = (n, r)",
)
