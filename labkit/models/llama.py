"""A readable Llama-family forward pass (Llama, Qwen2, Qwen3) over a flat batch of tokens.

The weights are the checkpoint's tensors by their Hugging Face names; q/k/v and gate/up are fused into one matrix
each (the named entries become views of it, so nothing is stored twice, transformers' model included). Each matrix
multiply goes through ``prepacked_linear`` (fast_linear.py), whose copy is taken when the model is built: to change
weights afterwards, build it again. The ``attend`` callback owns the KV cache: the part the labs and the engine swap.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
import torch.nn.functional as F

from labkit.kv.contiguous import ContiguousKVCache
from labkit.models.config import ModelConfig
from labkit.models.fast_linear import LinearFn, MatmulPath, matmul_path, prepacked_linear
from labkit.models.layers import apply_rope, rms_norm, rope_cos_sin, rope_inverse_frequencies, swiglu_mlp

# attend(layer, q [T,Hq,D], k [T,Hkv,D], v [T,Hkv,D]) -> [T,Hq,D]
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class DecoderLayer:
    """One decoder layer: its norm gains, and its four projections as functions of the input."""

    input_norm: torch.Tensor
    qkv: LinearFn  # hidden -> (Hq + 2·Hkv)·D, bias included (Qwen2)
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o_proj: LinearFn  # Hq·D -> hidden
    post_norm: torch.Tensor
    gate_up: LinearFn  # hidden -> 2·intermediate
    down: LinearFn  # intermediate -> hidden


class LlamaModel:
    """The model as labkit runs it: embeddings, decoder layers, final norm and LM head."""

    def __init__(
        self,
        weights: dict[str, torch.Tensor],
        config: ModelConfig,
        tokenizer=None,
        prepack: bool = True,
        hf_loader: Callable[[], Any] | None = None,
    ):
        """``weights`` by their Hugging Face names; ``hf_loader()`` builds transformers' model of the same
        architecture when first asked for (``hf``). ``prepack=False`` forces plain ``F.linear``;
        otherwise labkit tries the fast path (fast_linear.py)."""
        self.config = config
        self.tokenizer = tokenizer
        self.weights = dict(weights)
        self.weights.setdefault("lm_head.weight", self.weights["model.embed_tokens.weight"])  # tied embeddings
        fused = [
            _fuse_projections(self.weights, f"model.layers.{i}.", config.qkv_bias) for i in range(config.num_layers)
        ]
        self._hf_loader, self._hf = hf_loader, None
        self.embed = self.weights["model.embed_tokens.weight"]
        self.rms_norm = rms_norm  # labkit.batch_invariant swaps in one that adds in a fixed order
        self.final_norm = self.weights["model.norm.weight"]
        self.matmul = (
            matmul_path(self.device, self.dtype, self.weight_bytes()) if prepack else MatmulPath(False, "prepack=False")
        )
        self.prepacked = self.matmul.prepacked
        self.lm_head = prepacked_linear(self.weights["lm_head.weight"], enabled=self.prepacked)
        self.layers = [
            _layer(self.weights, f"model.layers.{i}.", qkv, gate_up, self.prepacked)
            for i, (qkv, gate_up) in enumerate(fused)
        ]
        inv_freq, self.rope_scaling = rope_inverse_frequencies(config.rope, config.head_dim)
        self.inv_freq = inv_freq.to(self.device)

    @property
    def hf(self):
        """transformers' own model over these same tensors: the course's oracle. Built (and transformers
        imported, several seconds) the first time it is asked for."""
        if self._hf is None:
            if self._hf_loader is None:
                raise RuntimeError(f"{self.config.name} has no transformers counterpart to build")
            self._hf = _sharing(self._hf_loader(), self.weights)
        return self._hf

    def projection_weights(self, layer: int) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """Layer ``layer``'s four projections as labkit multiplies them (q, k and v in one matrix; gate and
        up in one), each as (weight, bias or None); only q, k and v have a bias (Qwen2)."""
        w, prefix = self.weights, f"model.layers.{layer}."
        parts = {
            "qkv": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            "o_proj": ["self_attn.o_proj"],
            "gate_up": ["mlp.gate_proj", "mlp.up_proj"],
            "down": ["mlp.down_proj"],
        }
        out = {}
        for name, modules in parts.items():
            weight = torch.cat([w[f"{prefix}{m}.weight"] for m in modules])
            bias = w.get(f"{prefix}self_attn.q_proj.bias") if name == "qkv" else None
            out[name] = (weight, None if bias is None else torch.cat([w[f"{prefix}{m}.bias"] for m in modules]))
        return out

    def layers_with(self, linear: Callable[[torch.Tensor, torch.Tensor | None], LinearFn]) -> list[DecoderLayer]:
        """The decoder layers with each projection computed by ``linear(weight, bias)`` (as :meth:`projection_weights`
        gives them), everything else shared: how a quantized model is made."""
        return [
            replace(
                layer, **{name: linear(weight, bias) for name, (weight, bias) in self.projection_weights(i).items()}
            )
            for i, layer in enumerate(self.layers)
        ]

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    def num_parameters(self) -> int:
        return sum(t.numel() for t in _distinct(self.weights.values()))

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in _distinct(self.weights.values()))

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attend: AttendFn,
        logits_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run T tokens (from one or many sequences) through the model; float32 logits out."""
        cfg = self.config
        x = F.embedding(input_ids, self.embed)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.rope_scaling, x.dtype)
        for index, layer in enumerate(self.layers):
            q, k, v = self._project_qkv(layer, self.rms_norm(x, layer.input_norm, cfg.rms_norm_eps))
            out = attend(index, apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
            x = x + layer.o_proj(out.reshape(x.shape[0], -1))
            x = x + swiglu_mlp(self.rms_norm(x, layer.post_norm, cfg.rms_norm_eps), layer.gate_up, layer.down)
        if logits_indices is not None:
            x = x[logits_indices]
        return self.lm_head(self.rms_norm(x, self.final_norm, cfg.rms_norm_eps)).float()

    def _project_qkv(self, layer: DecoderLayer, h: torch.Tensor):
        """One matmul for q, k and v, split into heads; Qwen3 normalises q and k per head."""
        cfg = self.config
        qkv = layer.qkv(h)
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.reshape(-1, cfg.num_heads, cfg.head_dim)
        k = k.reshape(-1, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(-1, cfg.num_kv_heads, cfg.head_dim)
        if layer.q_norm is not None:
            q = self.rms_norm(q, layer.q_norm, cfg.rms_norm_eps)
            k = self.rms_norm(k, layer.k_norm, cfg.rms_norm_eps)
        return q, k, v

    # --- one sequence with a contiguous cache: the two phases of generation -------------

    def prefill(self, token_ids: list[int] | torch.Tensor) -> tuple[torch.Tensor, ContiguousKVCache]:
        """Phase 1: the whole prompt in one pass. Returns logits [T, V] and the filled cache."""
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.device)
        cache = ContiguousKVCache(self.config.num_layers)
        positions = torch.arange(len(ids), device=self.device)
        return self.forward(ids, positions, cache.attend), cache

    def decode(self, token_id: int, cache: ContiguousKVCache) -> torch.Tensor:
        """Phase 2: one new token, attending over the cache and appending to it. Logits [V]."""
        ids = torch.tensor([token_id], device=self.device)
        positions = torch.tensor([cache.length], device=self.device)
        return self.forward(ids, positions, cache.attend)[0]


def _fuse_projections(weights: dict[str, torch.Tensor], prefix: str, bias: bool):
    """Concatenate a layer's q/k/v and gate/up weights; its entries in ``weights`` become views of the result."""
    qkv = [f"{prefix}self_attn.{p}_proj" for p in "qkv"]
    gate_up = [f"{prefix}mlp.gate_proj", f"{prefix}mlp.up_proj"]
    qkv_bias = _fuse(weights, [f"{m}.bias" for m in qkv]) if bias else None
    return (_fuse(weights, [f"{m}.weight" for m in qkv]), qkv_bias), _fuse(weights, [f"{m}.weight" for m in gate_up])


def _fuse(weights: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    fused = torch.cat([weights[name] for name in names], dim=0)
    start = 0
    for name in names:
        rows = weights[name].shape[0]
        weights[name] = fused[start : start + rows]
        start += rows
    return fused


def _layer(weights: dict[str, torch.Tensor], prefix: str, qkv, gate_up: torch.Tensor, prepack: bool) -> DecoderLayer:
    qkv_weight, qkv_bias = qkv
    return DecoderLayer(
        input_norm=weights[f"{prefix}input_layernorm.weight"],
        qkv=prepacked_linear(qkv_weight, qkv_bias, enabled=prepack),
        q_norm=weights.get(f"{prefix}self_attn.q_norm.weight"),
        k_norm=weights.get(f"{prefix}self_attn.k_norm.weight"),
        o_proj=prepacked_linear(weights[f"{prefix}self_attn.o_proj.weight"], enabled=prepack),
        post_norm=weights[f"{prefix}post_attention_layernorm.weight"],
        gate_up=prepacked_linear(gate_up, enabled=prepack),
        down=prepacked_linear(weights[f"{prefix}mlp.down_proj.weight"], enabled=prepack),
    )


def _sharing(hf_model, weights: dict[str, torch.Tensor]):
    """Point transformers' model at labkit's tensors (the fused views), so nothing is stored twice."""
    hf_model.load_state_dict(weights, strict=True, assign=True)
    if getattr(hf_model.config, "tie_word_embeddings", False):  # assign gave the two names two parameters
        hf_model.get_output_embeddings().weight = hf_model.get_input_embeddings().weight
    return hf_model.requires_grad_(False).eval()


def _distinct(tensors) -> list[torch.Tensor]:
    """Each tensor once (tied embeddings are one tensor under two names)."""
    return list({id(t): t for t in tensors}.values())
