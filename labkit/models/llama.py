"""A readable Llama-family forward pass (Llama, Qwen2, Qwen3) over a flat batch of tokens.

The weights are the Hugging Face model's own tensors; q/k/v and gate/up are fused into one
matrix each (and the HF modules are pointed at views of them, so nothing is stored twice).
Each matrix multiply goes through ``prepacked_linear``: plain ``F.linear`` in meaning, with
the weight laid out once for the CPU's kernels where that is faster (see fast_linear.py).
That copy is taken when the model is built: to change weights afterwards, build it again.
The pass takes any number of sequences at once, flattened into T tokens: the ``attend``
callback owns the KV cache, which is exactly the part the labs and the engine swap out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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

    def __init__(self, hf_model, config: ModelConfig, tokenizer=None, prepack: bool = True):
        """``prepack=False`` forces plain ``F.linear``; otherwise labkit tries the fast path (fast_linear.py)."""
        self.hf = hf_model.eval()
        self.config = config
        self.tokenizer = tokenizer
        inner = hf_model.model
        self.embed = inner.embed_tokens.weight
        self.final_norm = inner.norm.weight
        self.matmul = (
            matmul_path(self.device, self.dtype, self.weight_bytes()) if prepack else MatmulPath(False, "prepack=False")
        )
        self.prepacked = self.matmul.prepacked
        self.lm_head = prepacked_linear(hf_model.lm_head.weight, enabled=self.prepacked)
        self.layers = [_fuse_layer(layer, self.prepacked) for layer in inner.layers]
        inv_freq, self.rope_scaling = rope_inverse_frequencies(config.rope, config.head_dim)
        self.inv_freq = inv_freq.to(self.device)

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.hf.parameters())

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.hf.parameters())

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
            q, k, v = self._project_qkv(layer, rms_norm(x, layer.input_norm, cfg.rms_norm_eps))
            out = attend(index, apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
            x = x + layer.o_proj(out.reshape(x.shape[0], -1))
            x = x + swiglu_mlp(rms_norm(x, layer.post_norm, cfg.rms_norm_eps), layer.gate_up, layer.down)
        if logits_indices is not None:
            x = x[logits_indices]
        return self.lm_head(rms_norm(x, self.final_norm, cfg.rms_norm_eps)).float()

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
            q = rms_norm(q, layer.q_norm, cfg.rms_norm_eps)
            k = rms_norm(k, layer.k_norm, cfg.rms_norm_eps)
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


def _fuse_layer(hf_layer, prepack: bool) -> DecoderLayer:
    """Concatenate q/k/v and gate/up weights, and point the HF modules at views of the result."""
    attn, mlp = hf_layer.self_attn, hf_layer.mlp
    qkv = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
    gate_up = _fuse([mlp.gate_proj, mlp.up_proj])
    bias = None
    if attn.q_proj.bias is not None:
        bias = _fuse([attn.q_proj, attn.k_proj, attn.v_proj], attribute="bias")
    return DecoderLayer(
        input_norm=hf_layer.input_layernorm.weight,
        qkv=prepacked_linear(qkv, bias, enabled=prepack),
        q_norm=getattr(getattr(attn, "q_norm", None), "weight", None),
        k_norm=getattr(getattr(attn, "k_norm", None), "weight", None),
        o_proj=prepacked_linear(attn.o_proj.weight, enabled=prepack),
        post_norm=hf_layer.post_attention_layernorm.weight,
        gate_up=prepacked_linear(gate_up, enabled=prepack),
        down=prepacked_linear(mlp.down_proj.weight, enabled=prepack),
    )


def _fuse(modules: list[torch.nn.Module], attribute: str = "weight") -> torch.Tensor:
    fused = torch.cat([getattr(m, attribute).detach() for m in modules], dim=0)
    start = 0
    for module in modules:
        rows = getattr(module, attribute).shape[0]
        setattr(module, attribute, torch.nn.Parameter(fused[start : start + rows], requires_grad=False))
        start += rows
    return fused
