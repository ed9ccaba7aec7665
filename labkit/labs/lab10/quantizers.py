"""Lab 10, what the int8 and int4 checks share: the weights they quantize and the rules any quantizer's outputs keep.

A learner's numbers are judged by what they must satisfy, not compared with labkit's bit for bit, so an answer that
stores scales in fp32 rather than fp16 passes as it should; the dequantizer is then run on labkit's own codes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import raised_mismatch
from labkit.labs.common.learner_errors import raised_in
from labkit.labs.common.shared import course_model, rng, torch_generator

SCALE_RTOL = 1.5e-3  # fp16 keeps 10 bits: a scale rounded to it (labkit stores them so) is within 1e-3
STEP_SLACK = 1e-3  # a weight may come back up to half a step, plus this share of a step, away
ZEROS_HINT = (
    "A row (int8) or group (int4) of zeros has largest |w| 0, so scale 0, and 0 / 0 is NaN: keep the scale above 0 "
    "(.clamp(min=1e-8)) so its codes are 0 (int4: its zero point too) and it comes back as zeros."
)


def plain(value: Any) -> torch.Tensor:
    """A learner's output as a tensor of its own on the CPU (what the grader can load back)."""
    return torch.as_tensor(value).detach().cpu().contiguous().clone()


def close(a: torch.Tensor, b: torch.Tensor, rtol: float = SCALE_RTOL) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), rtol=rtol, atol=1e-12))


def real_weights(seed: int) -> list[tuple[str, torch.Tensor]]:
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


def seeded_weight(seed: int, rows: int, columns: int) -> torch.Tensor:
    w = torch.randn(rows, columns, generator=torch_generator(seed)) * 0.05
    w[rows // 3, columns // 4] = 1.5  # an outlier widens its own row (int8) and its own group (int4)
    w[-1] = 0  # a row of zeros (a pruned channel): scale 0, unless kept above it, and no NaN codes
    return w


def all_zeros(scale: torch.Tensor, want: torch.Tensor, held: torch.Tensor, where: str, part: str):
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


def first_mismatch(judge: Callable[[Any, Any], Mismatch | None], expected: list, got: list) -> Mismatch | None:
    """The first case, in order, whose answer ``judge`` finds wrong."""
    return next((mistake for mistake in map(judge, expected, got) if mistake is not None), None)


def described(case: dict[str, Any]) -> str:
    rows, columns = case["weight"].shape
    return f"{case['name']} ([{rows}, {columns}])"


def mostly(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` equals ``b`` almost everywhere: a rule followed, but for the few codes a clamp moved."""
    return a.shape == b.shape and float((a.double() == b.double()).double().mean()) > 0.99


def rounding_mistake(codes: torch.Tensor, exact: torch.Tensor) -> str | None:
    """A hint if the codes are the exact quotients floored or truncated instead of rounded."""
    codes = codes.double()
    if mostly(codes, exact.floor()):
        return (
            "Your codes are floor(w / scale): flooring moves every weight down, up to a whole step. Round to the "
            "nearest code (torch.round) so no weight moves more than half a step."
        )
    if mostly(codes, exact.trunc()):
        return (
            "Your codes are w / scale cut toward zero: converting to an integer type (.to(torch.int8)) truncates. "
            "Round first (torch.round), then convert."
        )
    return None


def check_codes_dtype(
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


# what typical wrong dequantizers return on labkit's codes (a case of the check), with the hint that names each
DequantizeMistakes = Callable[[dict[str, Any]], list[tuple[torch.Tensor, str]]]


def compare_dequantized(case, mine: Any, where: str, scheme: str, mistakes: DequantizeMistakes) -> Mismatch | None:
    """The learner's dequantizer on labkit's codes, judged once their quantizer's own outputs passed (so a
    quantizer's mistake is named first, even when the dequantizer written to match it fails on labkit's codes)."""
    record = raised_in(mine)
    if record is not None:
        return raised_mismatch(record, shape_error(record))
    want = case["dequantized"]
    if mine.shape == want.shape and bool(torch.allclose(mine.double(), want.double(), rtol=1e-5, atol=1e-7)):
        return None
    difference = f"{where}: dequantize_{scheme} of labkit's codes gave back another weight than labkit's"
    if mine.shape != want.shape:
        return Mismatch(f"{where}: dequantize_{scheme} returned shape {list(mine.shape)}, expected {list(want.shape)}")
    r, c = divmod(int((mine.double() - want.double()).abs().argmax()), want.shape[1])
    difference += f" (at [{r}, {c}]: {float(mine[r, c]):.6g}, expected {float(want[r, c]):.6g})"
    for wrong, hint in mistakes(case):
        if wrong.shape == mine.shape and bool(torch.allclose(mine.double(), wrong.double(), rtol=1e-5, atol=1e-7)):
            return Mismatch(difference, hint)
    return Mismatch(difference, "A weight is its code times its scale (after taking away the zero point, in int4).")


def shape_error(record: dict[str, Any]) -> str | None:
    """A hint for the broadcasting error of a scale laid along the wrong axis."""
    if "must match the size of tensor" in record["message"] or "shape" in record["message"]:
        return (
            "The shapes do not line up. A weight and its codes are [out, in]; a per-row value (int8's scale) is "
            "[out] and multiplies as scale[:, None], one column that spreads along each row; int4's scale and zero "
            "are [out, groups] and spread over each group's columns."
        )
    return None
