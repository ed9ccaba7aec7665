"""A model whose linear layers multiply in int8 (:func:`~labkit.models.int8_linear.int8_linear`): what
``--quantization int8`` serves. The LM head is quantized when ``lm_head=True``. The rest (embedding, norms,
attention and so the KV cache) computes in the backend's ``activations`` dtype where the model given is in fp32:
in bf16 where that made the decode steps faster (:mod:`labkit.engine.int8_choice`), as it was otherwise.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from labkit.models.fast_linear import prepacked_linear
from labkit.models.int8_linear import Int8Backend, int8_linear
from labkit.models.llama import LlamaModel
from labkit.models.quant import QuantizedMatmul

# The LM head (49,152 x 576, a fifth of SmolLM2-135M's weights) in int8 too, or not: measured on the default model
# over lab 10's 8 ShareGPT quality prompts x 32 tokens, greedy agreement 92.6% (head in fp32) against 93.0% (in int8),
# mean KL 0.033 against 0.037 nats, while the int8 head decoded at 1.15-1.38x the tok/s at batch 1, 8 and 32 in two
# runs (scripts/quant_bench.py, rows "w8a8, LM head float" and "w8a8"). The same agreement, faster: quantized.
QUANTIZE_LM_HEAD = True


class Int8Model(LlamaModel):
    """``model`` with its decoder linears (and the LM head if ``lm_head``) computed in int8 by ``backend``.

    Shares the embedding, norms and weights dict with ``model`` (the float weights stay, for the
    transformers oracle); ``model.layers`` (and their packed copies) are not kept. An fp32 ``model`` under a
    backend with bf16 ``activations`` gets a bf16 copy of its embedding and norms instead (the linears are
    quantized from the fp32 weights all the same).
    """

    def __init__(self, model: LlamaModel, backend: Int8Backend, lm_head: bool = QUANTIZE_LM_HEAD):
        if isinstance(model, Int8Model):
            raise ValueError("this model already computes in int8; quantize the original model instead")
        if not backend.works:
            raise ValueError(f"cannot compute in int8 here: {backend.reason}")
        vars(self).update(vars(model))
        self.backend = backend
        self.layers = model.layers_with(lambda weight, bias: int8_linear(weight, bias, backend))
        self.quantized_lm_head = lm_head
        if lm_head:
            self.lm_head = int8_linear(self.weights["lm_head.weight"], None, backend)
        if backend.activations != model.dtype and model.dtype == torch.float32:
            self._compute_around_linears_in(backend.activations, lm_head)
        head = "LM head too" if lm_head else "LM head in " + str(model.dtype).removeprefix("torch.")
        self.matmul = QuantizedMatmul(False, f"int8 x int8, per channel x per token ({head}): {backend.reason}")
        self.prepacked = False

    def _compute_around_linears_in(self, dtype: torch.dtype, lm_head: bool) -> None:
        """The embedding, the norms (and an unquantized LM head) in ``dtype``: what the rest of a step computes in.
        The weights the int8 layers stand for stay as they were, for the transformers oracle."""
        tied = self.weights["lm_head.weight"] is self.embed
        self.weights = {
            name: weight if ".layers." in name and "proj." in name else weight.to(dtype)
            for name, weight in self.weights.items()
        }
        if tied:
            self.weights["lm_head.weight"] = self.weights["model.embed_tokens.weight"]
        self.embed, self.final_norm = self.weights["model.embed_tokens.weight"], self.weights["model.norm.weight"]
        norms = ("input_norm", "q_norm", "k_norm", "post_norm")
        self.layers = [
            replace(
                layer, **{name: getattr(layer, name).to(dtype) for name in norms if getattr(layer, name) is not None}
            )
            for layer in self.layers
        ]
        if not lm_head:
            self.lm_head = prepacked_linear(self.weights["lm_head.weight"], enabled=self.prepacked)

    def weight_bytes(self) -> int:
        """Bytes held: the int8 codes and one fp32 scale per output channel, plus what stays in float."""
        projections = [self.projection_weights(i) for i in range(len(self.layers))]
        dense = [weight for layer in projections for weight, _ in layer.values()]
        if self.quantized_lm_head:  # an int8 copy beside the float embedding it is tied to (or not)
            dense_head = self.weights["lm_head.weight"]
            extra = dense_head.shape[0] * (dense_head.shape[1] + 4)
            if dense_head is not self.embed:
                extra -= dense_head.numel() * dense_head.element_size()
        else:
            extra = 0
        float_bytes = sum(w.numel() * w.element_size() for w in dense)
        int8_bytes = sum(w.shape[0] * (w.shape[1] + 4) for w in dense)
        return super().weight_bytes() - float_bytes + int8_bytes + extra
