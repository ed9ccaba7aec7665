"""What lab 10's checks and notebook share: a model whose weights went through any quantize-then-dequantize
round trip, which is how a learner's quantizer meets the real model."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F

from labkit.models.llama import LlamaModel

RoundTrip = Callable[[torch.Tensor], torch.Tensor]


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


def first_layers(model: LlamaModel, layers: int) -> LlamaModel:
    """A copy of ``model`` that runs its first ``layers`` decoder layers only (then its final norm and LM head):
    real weights, in a model that quantizes and runs in a fraction of the time. Everything is shared."""
    cut = copy.copy(model)
    cut.config = replace(model.config, num_layers=layers)
    cut.layers = model.layers[:layers]
    return cut


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
