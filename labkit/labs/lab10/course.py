"""The course's own int8 and int4 quantizers (:mod:`labkit.models.quant`) in the plain tensors lab 10 asks for: the
grader's oracles and answers."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from labkit.labs.lab10.runs import RoundTrip
from labkit.models.quant import (
    GROUP_SIZE,
    Int4Weight,
    Int8Weight,
    dequantize_int4,
    dequantize_int8,
    quantize_int4,
    quantize_int8,
)


def course_quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """labkit's int8: codes (int8, [out, in]) and one scale per output row (fp32, [out])."""
    quantized = quantize_int8(weight)
    return quantized.codes, quantized.scale


def course_dequantize_int8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return dequantize_int8(Int8Weight(codes, scale))


def course_quantize_int4(
    weight: torch.Tensor, group_size: int = GROUP_SIZE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """labkit's 4-bit: codes (uint8, [out, in], padding cut off), scale (fp32) and zero (uint8), [out, groups]."""
    quantized = quantize_int4(weight, group_size)
    return quantized.codes[:, : weight.shape[1]].contiguous(), quantized.scale, quantized.zero


def course_dequantize_int4(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int = GROUP_SIZE
) -> torch.Tensor:
    columns = codes.shape[1]
    padded = F.pad(codes, (0, scale.shape[1] * group_size - columns))
    return dequantize_int4(Int4Weight(padded, scale, zero, columns, group_size))


def course_round_trips(group_size: int = GROUP_SIZE) -> dict[str, RoundTrip]:
    """The course's int8 and int4 (groups of ``group_size``) as weight -> the weight its codes stand for."""
    return {
        "int8": lambda w: course_dequantize_int8(*course_quantize_int8(w)),
        "int4": lambda w: course_dequantize_int4(*course_quantize_int4(w, group_size), group_size),
    }
