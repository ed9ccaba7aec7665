"""Lab 2, exercise 3: the bytes of KV cache one token leaves behind, on the shapes of four real models."""

from __future__ import annotations

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints
from labkit.models.config import ModelConfig


def _config(name: str, layers: int, heads: int, kv_heads: int, head_dim: int) -> ModelConfig:
    return ModelConfig(
        name=name,
        architecture="llama",
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=heads * head_dim,
        intermediate_size=4 * heads * head_dim,
        vocab_size=1000,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
    )


SHAPES = (
    ("SmolLM2-135M", 30, 9, 3, 64),
    ("Llama-3.1-8B", 32, 32, 8, 128),
    ("Qwen3-8B", 36, 32, 8, 128),
    ("Llama-3.1-70B", 80, 64, 8, 128),
)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _bytes_inputs(seed: int) -> tuple[list[tuple[ModelConfig, torch.dtype]]]:
    pick = rng(seed)
    cases = [(_config(*SHAPES[0]), torch.float32), (_config(*SHAPES[1]), torch.bfloat16)]
    cases.append((_config(*pick.choice(SHAPES[2:])), pick.choice(DTYPES)))
    return (cases,)


def _compare_bytes(expected, got) -> Mismatch | None:
    if not isinstance(got, list) or len(got) != len(expected["bytes"]):
        return Mismatch(f"expected a list of {len(expected['bytes'])} numbers, got {got!r}")
    for want, have, (config, dtype) in zip(expected["bytes"], got, expected["cases"]):
        if isinstance(have, (int, float)) and have == want:
            continue
        shown = f"{have:,}" if isinstance(have, (int, float)) else repr(have)
        where = f"{config.name} in {str(dtype).removeprefix('torch.')}: expected {want:,} bytes per token, got {shown}"
        if not isinstance(have, (int, float)):
            return Mismatch(where, "Return a whole number of bytes (an int).")
        hints = {
            want / 2: "That is half: a token stores a key AND a value at every layer (the factor 2).",
            want * config.num_heads / config.num_kv_heads: "You counted query heads. Only the KV heads are cached "
            "(grouped-query attention): use num_kv_heads.",
            want / torch.empty((), dtype=dtype).element_size(): "That counts values, not bytes: multiply by the bytes "
            "per value of the dtype (torch.empty((), dtype=dtype).element_size()).",
            want / config.num_layers: "Every layer keeps its own K and V: multiply by num_layers.",
        }
        return Mismatch(where, hints.get(have))
    return None


register(
    Exercise(
        id="lab2.kv_bytes_per_token",
        functions=("kv_bytes_per_token",),
        answers=("labkit.models.config.ModelConfig.kv_bytes_per_token",),
        make_inputs=_bytes_inputs,
        run=lambda functions, inputs: [functions[0](config, dtype) for config, dtype in inputs[0]],
        oracle=lambda inputs: {
            "bytes": [config.kv_bytes_per_token(dtype) for config, dtype in inputs[0]],
            "cases": inputs[0],
        },
        compare=_compare_bytes,
        tested="kv_bytes_per_token(config, dtype) for SmolLM2-135M (fp32), Llama 3.1 8B (bf16) and one more model",
        hint="2 (K and V) x num_layers x num_kv_heads x head_dim x bytes per value.",
    )
)

register_hints(
    "lab2.kv_bytes_per_token",
    "Count what one token leaves at every layer: a key and a value, each one vector per KV head (not per query "
    "head), each number stored in the cache's dtype.",
    "Multiply 2 (key and value) by the layers, the KV heads and head_dim, then by the bytes one number takes.",
    "config.num_layers, config.num_kv_heads, config.head_dim; torch.empty((), dtype=dtype).element_size() is the "
    "bytes per number.",
)
