"""``quantization="int8"`` (``labkit serve --quantization int8``): the server's linears in int8, when asked.

vLLM never quantizes unasked, and neither does labkit: the flag is opt-in, with vLLM's name. The
one value is ``"int8"``: int8 weights (per output channel) times int8 activations (per token) on
PyTorch's int8 kernels, whichever of them works here (tried at start) and ran the model's decode steps
fastest (timed once per machine, see :mod:`labkit.engine.int8_choice`). Where none works, the model serves
unquantized and says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

QUANTIZATIONS = ("int8",)


def check_quantization(value: str | None) -> str | None:
    """``value`` if labkit serves it (None: unquantized); else an error saying what is supported."""
    if value is None or value in QUANTIZATIONS:
        return value
    hint = (
        " lab 10's int4 is weight-only: it is dequantized before each float matmul, slower than fp32 on a CPU,"
        " so it is for measuring bytes and quality (scripts/quant_bench.py), not for serving."
        if value == "int4"
        else ""
    )
    raise ValueError(
        f"quantization {value!r} is not supported; labkit serves 'int8' (int8 weights per channel times int8 "
        f"activations per token) or, leaving it out, the unquantized model.{hint}"
    )


@dataclass(frozen=True)
class QuantizationChoice:
    """What the server computes its linears in, and why, in words for its start-up line and ``labkit info``."""

    quantization: str | None
    reason: str
    engine: str | None = None  # torch's quantized engine that computes the int8 linears (None: not int8)

    def describe(self) -> str:
        return f"{self.quantization or 'unquantized'} ({self.reason})"


def quantize_for_serving(
    model, quantization: str | None, choose_backend: Callable | None = None
) -> tuple[Any, QuantizationChoice]:
    """``model`` as asked: computing in int8 if ``quantization="int8"`` and an int8 kernel works here, else as is.

    ``choose_backend()`` returns the :class:`~labkit.models.int8_linear.Int8Backend` to use (default: the one
    :func:`~labkit.engine.int8_choice.choose_int8_backend` finds by trying).
    """
    from labkit.engine.int8_choice import choose_int8_backend  # torch: only once a model is at hand
    from labkit.models.int8_model import Int8Model

    if check_quantization(quantization) is None:
        return model, QuantizationChoice(None, "not asked for (--quantization int8 turns it on)")
    if model.device.type != "cpu":
        return model, QuantizationChoice(None, f"int8 kernels are tried on a CPU only; {model.device.type} runs as is")
    backend = (choose_backend or choose_int8_backend)()
    if not backend.works:
        return model, QuantizationChoice(None, f"int8 asked for, but {backend.reason}; serving unquantized")
    return Int8Model(model, backend), QuantizationChoice("int8", backend.reason, backend.engine)
