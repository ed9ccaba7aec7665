"""Weight-only quantization: fewer bytes per weight, so a decode step has fewer bytes to read.

Decode is memory-bound (every token reads every weight), so storing weights in 8 or 4 bits instead of 16 or 32
moves the single-stream bound and frees memory for KV. Two schemes, the ones vLLM's weight-only kernels serve:
``int8`` per output channel, symmetric (:func:`quantize_int8`), and ``int4`` in groups of 128 input columns,
asymmetric, GPTQ/AWQ style (:func:`quantize_int4`). Scales are kept in fp16 (rounded up to a value fp16 holds, so
storing them loses nothing) and zero points in one byte: 4-bit weights then cost 0.5 + 3/128 = 0.52 bytes each.
Only the decoder layers' linears are quantized, as vLLM's GPTQ and AWQ checkpoints keep the rest as it was.

The layers here dequantize, then call ``F.linear``: on a CPU that is *slower* than fp32, since nothing fuses the
unpacking into the matrix kernel (PyTorch's ``_weight_int8pack_mm`` took 20x fp32's time on a 100-token prefill
here). What transfers to a GPU with real int8/int4 kernels is the bytes, not this step time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from labkit.models.fast_linear import MatmulPath
from labkit.models.llama import LlamaModel
from labkit.models.tokens import Prompt, encode_prompt

SCHEMES = ("int8", "int4")
INT8_MAX = 127
INT4_LEVELS = 15  # codes 0..15
GROUP_SIZE = 128
SMALLEST_SCALE = 2.0**-24  # fp16's smallest step: an all-zero row or group still divides by something


class Int8Weight(NamedTuple):
    """A weight [out, in] as int8 codes and one fp32 scale per output row: w ≈ codes × scale."""

    codes: torch.Tensor  # int8 [out, in]
    scale: torch.Tensor  # fp32 [out]


class Int4Weight(NamedTuple):
    """A weight [out, in] as 4-bit codes in groups of ``group_size`` columns: w ≈ (codes − zero) × scale."""

    codes: torch.Tensor  # uint8 [out, padded in], values 0..15 (packed two to a byte when stored)
    scale: torch.Tensor  # fp32 [out, groups]
    zero: torch.Tensor  # uint8 [out, groups], values 0..15
    in_features: int  # columns before padding to whole groups
    group_size: int


def _storable(scale: torch.Tensor) -> torch.Tensor:
    """The scale rounded up to a value fp16 holds exactly (never zero), in fp32.

    Up, not to nearest: a scale rounded down would leave the largest weight past the last code.
    """
    scale = scale.clamp_min(SMALLEST_SCALE)
    half = scale.half()
    up = torch.nextafter(half, torch.tensor(float("inf"), dtype=torch.float16, device=half.device))
    return torch.where(half.float() < scale, up, half).float()


def _check_weight(weight: torch.Tensor) -> None:
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(
            f"a linear weight is a 2-D float tensor [out_features, in_features]; got {weight.dim()}-D "
            f"{weight.dtype}: pass the layer's .weight"
        )


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Per-output-channel symmetric int8: one scale per row, ``absmax / 127``, round to nearest."""
    _check_weight(weight)
    w = weight.detach().float()
    scale = _storable(w.abs().amax(dim=1) / INT8_MAX)
    codes = torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return Int8Weight(codes, scale)


def dequantize_int8(quantized: Int8Weight) -> torch.Tensor:
    """The fp32 weight the int8 codes stand for: codes × their row's scale."""
    return quantized.codes.float() * quantized.scale[:, None]


def quantize_int4(weight: torch.Tensor, group_size: int = GROUP_SIZE) -> Int4Weight:
    """Group-wise asymmetric 4-bit: each ``group_size`` columns of a row get a scale and a zero point.

    The range of a group is stretched to hold 0 (so the zero point is a whole code in 0..15 and
    a group of zeros stays exact); a row whose length is not a whole number of groups is padded
    with zeros, which the padded groups' range already holds.
    """
    _check_weight(weight)
    if not (isinstance(group_size, int) and group_size >= 2):
        raise ValueError(f"group_size must be a whole number of columns, 2 or more (128 is usual); got {group_size!r}")
    rows, in_features = weight.shape
    padded = -in_features % group_size
    groups = F.pad(weight.detach().float(), (0, padded)).reshape(rows, -1, group_size)
    low = groups.amin(dim=2).clamp_max(0)
    high = groups.amax(dim=2).clamp_min(0)
    scale = _storable((high - low) / INT4_LEVELS)
    zero = torch.round(-low / scale).clamp(0, INT4_LEVELS)
    codes = (torch.round(groups / scale[..., None]) + zero[..., None]).clamp(0, INT4_LEVELS)
    return Int4Weight(codes.reshape(rows, -1).to(torch.uint8), scale, zero.to(torch.uint8), in_features, group_size)


def dequantize_int4(quantized: Int4Weight) -> torch.Tensor:
    """The fp32 weight the 4-bit codes stand for: (codes − zero) × scale, padding cut off."""
    rows = quantized.codes.shape[0]
    groups = quantized.codes.float().reshape(rows, -1, quantized.group_size)
    values = (groups - quantized.zero.float()[..., None]) * quantized.scale[..., None]
    return values.reshape(rows, -1)[:, : quantized.in_features]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last dimension (even columns in the low half)."""
    if codes.shape[-1] % 2:
        codes = F.pad(codes, (0, 1))
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor, columns: int) -> torch.Tensor:
    """The codes :func:`pack_nibbles` packed, ``columns`` of them per row."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1)[..., :columns]


@dataclass
class QuantizedLinear:
    """A linear layer computed from quantized weights: ``layer(x) ≈ F.linear(x, weight, bias)``.

    Holds only what a server would keep in memory (codes, fp16 scales, one-byte zeros, the
    bias); :attr:`nbytes` counts exactly those bytes.
    """

    scheme: str
    tensors: dict[str, torch.Tensor]
    out_features: int
    in_features: int
    group_size: int
    bias: torch.Tensor | None = None

    @classmethod
    def from_weight(
        cls, weight: torch.Tensor, bias: torch.Tensor | None, scheme: str, group_size: int = GROUP_SIZE
    ) -> QuantizedLinear:
        """Quantize ``weight`` (and keep ``bias`` as it is) with ``scheme``: ``"int8"`` or ``"int4"``."""
        out_features, in_features = weight.shape
        if scheme == "int8":
            q = quantize_int8(weight)
            tensors = dict(codes=q.codes, scale=q.scale.half())
        elif scheme == "int4":
            q4 = quantize_int4(weight, group_size)
            tensors = dict(codes=pack_nibbles(q4.codes), scale=q4.scale.half(), zero=q4.zero)
        else:
            raise ValueError(f"unknown quantization scheme {scheme!r}; use one of {SCHEMES}")
        tensors = {name: tensor.to(weight.device) for name, tensor in tensors.items()}
        return cls(scheme, tensors, out_features, in_features, group_size, bias)

    @property
    def nbytes(self) -> int:
        tensors = list(self.tensors.values()) + ([] if self.bias is None else [self.bias])
        return sum(t.numel() * t.element_size() for t in tensors)

    def dequantized(self) -> torch.Tensor:
        """The fp32 weight these codes stand for."""
        t = self.tensors
        if self.scheme == "int8":
            return dequantize_int8(Int8Weight(t["codes"], t["scale"].float()))
        codes = unpack_nibbles(t["codes"], t["zero"].shape[1] * self.group_size)
        return dequantize_int4(Int4Weight(codes, t["scale"].float(), t["zero"], self.in_features, self.group_size))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized().to(x.dtype), self.bias)


@dataclass(frozen=True)
class QuantizedMatmul(MatmulPath):
    """The matmul path of a quantized model, as ``labkit info`` and ``labkit bench`` show it."""

    def describe(self) -> str:
        return self.reason


class QuantizedModel(LlamaModel):
    """A :class:`LlamaModel` whose decoder linears are quantized; it shares everything else with the original."""

    def __init__(self, model: LlamaModel, scheme: str, group_size: int = GROUP_SIZE):
        if isinstance(model, QuantizedModel):
            raise ValueError("this model is already quantized; quantize the original model instead")
        vars(self).update(vars(model))  # embeddings, norms, LM head, config, tokenizer: shared, not copied
        self.scheme = scheme
        self.original = model
        self.layers = model.layers_with(
            lambda weight, bias: QuantizedLinear.from_weight(weight, bias, scheme, group_size)
        )
        self.matmul = QuantizedMatmul(False, f"{scheme} weights, dequantized per call (no fused int kernel)")
        self.prepacked = False

    def quantized_linears(self) -> list[QuantizedLinear]:
        return [getattr(layer, name) for layer in self.layers for name in ("qkv", "o_proj", "gate_up", "down")]

    def weight_bytes(self) -> int:
        """Bytes a server holds: the quantized linears, plus everything left unquantized."""
        linears = self.quantized_linears()
        dense = sum(q.out_features * q.in_features for q in linears) * self.original.dtype.itemsize
        dense_bias = sum(0 if q.bias is None else q.bias.numel() * q.bias.element_size() for q in linears)
        return self.original.weight_bytes() - dense - dense_bias + sum(q.nbytes for q in linears)


def quantize_model(model: LlamaModel, scheme: str, group_size: int = GROUP_SIZE) -> QuantizedModel:
    """``model`` with every decoder linear quantized by ``scheme`` (``"int8"`` or ``"int4"``).

    The original keeps working (its weights are untouched), so the two can be compared.
    """
    return QuantizedModel(model, scheme, group_size)


@dataclass(frozen=True)
class Quality:
    """How close a quantized model stays to the original, next token by next token."""

    agreement: float  # share of positions where both pick the same greedy token
    mean_kl: float  # mean KL(original || quantized) of the next-token distributions, nats
    prompts: int
    tokens_per_prompt: int

    def __str__(self) -> str:
        return (
            f"greedy agreement {self.agreement:.1%}, mean KL {self.mean_kl:.4f} nats "
            f"({self.prompts} prompts x {self.tokens_per_prompt} tokens)"
        )


@torch.inference_mode()
def quality(model: LlamaModel, quantized: LlamaModel, prompts: list[Prompt], n_tokens: int = 32) -> Quality:
    """Compare ``quantized`` with ``model`` on the original's own greedy continuation (``n_tokens``) of each prompt:
    both read prompt + continuation in one pass, and at each position we compare their next-token choice and
    distributions (KL). One shared text keeps one early disagreement from counting against every token after it.
    """
    if not prompts:
        raise ValueError(
            "quality needs at least one prompt; try labkit.workloads.sharegpt_quality_prompts(model.tokenizer)"
        )
    if not (isinstance(n_tokens, int) and n_tokens >= 1):
        raise ValueError(f"n_tokens must be a whole number, 1 or more; got {n_tokens!r}")
    agree = kl_sum = 0.0
    for prompt in prompts:
        ids = encode_prompt(model.tokenizer, prompt)
        continuation = _greedy(model, ids, n_tokens)
        text = ids + continuation[:-1]
        scored = slice(len(ids) - 1, len(text))
        reference = model.prefill(text)[0][scored].log_softmax(-1)
        candidate = quantized.prefill(text)[0][scored].log_softmax(-1)
        agree += float((candidate.argmax(-1) == torch.tensor(continuation, device=candidate.device)).sum())
        kl_sum += float((reference.exp() * (reference - candidate)).sum(-1).sum())
    positions = len(prompts) * n_tokens
    return Quality(agree / positions, kl_sum / positions, len(prompts), n_tokens)


def _greedy(model: LlamaModel, ids: list[int], n_tokens: int) -> list[int]:
    """The model's own greedy continuation of ``ids``, ``n_tokens`` long (end tokens included, not obeyed)."""
    logits, cache = model.prefill(ids)
    tokens = [int(logits[-1].argmax())]
    while len(tokens) < n_tokens:
        tokens.append(int(model.decode(tokens[-1], cache).argmax()))
    return tokens
