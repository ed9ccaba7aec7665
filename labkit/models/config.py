"""The few numbers about a model that serving cares about, read from its Hugging Face config."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-family model: enough to run it and to size its KV cache."""

    name: str
    architecture: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: dict = field(default_factory=dict)  # rope_type, rope_theta and scaling fields
    qkv_bias: bool = False  # Qwen2 adds a bias to the q, k and v projections
    qk_norm: bool = False  # Qwen3 normalises each head of q and k before RoPE
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()

    def kv_bytes_per_token(self, dtype: torch.dtype = torch.float32) -> int:
        """Bytes of K and V one token leaves behind: 2 × layers × kv_heads × head_dim × bytes."""
        bytes_per_value = torch.empty((), dtype=dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_value

    @classmethod
    def from_hf(cls, hf_config, name: str) -> "ModelConfig":
        """Read a transformers config; refuse architectures labkit's forward pass does not know."""
        arch = hf_config.model_type
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"model type {arch!r} is not supported; labkit runs {', '.join(SUPPORTED_ARCHITECTURES)} checkpoints"
            )
        head_dim = getattr(hf_config, "head_dim", None) or (hf_config.hidden_size // hf_config.num_attention_heads)
        eos = getattr(hf_config, "eos_token_id", None)
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        return cls(
            name=name,
            architecture=arch,
            num_layers=hf_config.num_hidden_layers,
            num_heads=hf_config.num_attention_heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads,
            head_dim=head_dim,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            vocab_size=hf_config.vocab_size,
            max_position_embeddings=hf_config.max_position_embeddings,
            rms_norm_eps=hf_config.rms_norm_eps,
            rope=_rope_parameters(hf_config),
            qkv_bias=arch == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
            qk_norm=arch == "qwen3",
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            eos_token_ids=eos_ids,
        )


def _rope_parameters(hf_config) -> dict:
    """RoPE settings under transformers 5 (rope_parameters) or 4.x (rope_theta + rope_scaling)."""
    params = getattr(hf_config, "rope_parameters", None)
    if not params:
        params = {
            "rope_theta": getattr(hf_config, "rope_theta", 10000.0),
            **(getattr(hf_config, "rope_scaling", None) or {}),
        }
    params = dict(params)
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    return params
