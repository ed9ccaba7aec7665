"""What lab 10's checks and notebook share: the course's quantizers in the lab's shapes, and a model
whose weights went through any quantize-then-dequantize round trip.

The lab asks for plain tensors (``codes, scale`` for int8; ``codes, scale, zero`` for int4, with
one column of codes per weight column), so the adapters here give :mod:`labkit.models.quant`'s
answers in exactly those shapes. ``model_with_weights`` is how a learner's quantizer meets the real
model: every decoder linear computes with ``round_trip(weight)``, the weight the codes stand for,
which is what a quantized layer multiplies by after unpacking (labkit's own does the same, per call).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F

from labkit.models.llama import LlamaModel
from labkit.models.quant import (
    GROUP_SIZE,
    Int4Weight,
    Int8Weight,
    dequantize_int4,
    dequantize_int8,
    quantize_int4,
    quantize_int8,
)

RoundTrip = Callable[[torch.Tensor], torch.Tensor]


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


def model_with_weights(model: LlamaModel, round_trip: RoundTrip) -> LlamaModel:
    """A copy of ``model`` whose decoder linears multiply by ``round_trip(weight)``; the rest is shared.

    The projections are fused as labkit runs them (q, k and v in one weight; gate and up in one),
    which changes nothing for a quantizer that works row by row. The original keeps working.
    """
    copy = object.__new__(LlamaModel)
    vars(copy).update(vars(model))
    copy.layers = [
        _layer_with(model.projection_weights(index), layer, round_trip) for index, layer in enumerate(model.layers)
    ]
    return copy


def _layer_with(projections: dict, layer, round_trip: RoundTrip):
    def linear(weight, bias):
        new = round_trip(weight.float())
        if not isinstance(new, torch.Tensor) or tuple(new.shape) != tuple(weight.shape):
            got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
            raise ValueError(
                f"the round trip turned a weight of shape {tuple(weight.shape)} into {got}; it must give back "
                "a tensor of the same shape: dequantize(quantize(weight))"
            )
        new = new.detach().to(weight.dtype)
        return lambda x: F.linear(x, new.to(x.dtype), bias)

    return replace(layer, **{name: linear(weight, bias) for name, (weight, bias) in projections.items()})
