"""The models served now, as the planner sees them: mixtures of experts, latent attention, sliding windows.

Each preset takes its shape from the model's published ``config.json`` on Hugging Face and its
total and active parameter counts from its model card or paper (the counts a config does not
state); the docstring of each names both. Weights are stored as each model is published: the
mixtures of 2024 and 2025 in bf16, DeepSeek-V3 in fp8 and gpt-oss with its experts in MXFP4.
``plan(hardware, "deepseek-v3", ...)`` plans any of them by name.
"""

from __future__ import annotations

from dataclasses import replace

from labkit.sim.cost_model import ModelSpec

# MXFP4 (the OCP microscaling format gpt-oss ships its experts in): 4-bit values, one 8-bit
# scale per block of 32, so 4 + 8/32 = 4.25 bits a weight.
MXFP4_BYTES_PER_PARAM = 4.25 / 8

DEEPSEEK_V3 = ModelSpec(
    "DeepSeek-V3",
    671e9,
    layers=61,
    kv_heads=128,
    head_dim=128,
    bytes_per_param=1.0,
    query_heads=128,
    context_length=131_072,
    hidden_size=7168,
    active_parameters=37e9,
    experts=256,
    experts_per_token=8,
    shared_experts=1,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
)
"""DeepSeek-V3: 671B parameters, 37B active per token, 128K context (model card, huggingface.co/deepseek-ai/DeepSeek-V3,
and the technical report, arXiv 2412.19437). From its config.json: num_hidden_layers 61, hidden_size 7168,
num_attention_heads and num_key_value_heads 128, v_head_dim 128, n_routed_experts 256, n_shared_experts 1,
num_experts_per_tok 8, kv_lora_rank 512, qk_rope_head_dim 64, and a quantization_config of fp8 (e4m3) in
128 x 128 blocks: one byte a weight, the block scales negligible. Its MLA caches 512 + 64 values per token
and layer. (Queries and keys are 192 wide, 128 + 64; ``head_dim`` is the values' 128, so the prefill's
attention arithmetic is counted about 20% low.)"""

QWEN3_30B_A3B = ModelSpec(
    "Qwen3-30B-A3B",
    30.5e9,
    layers=48,
    kv_heads=4,
    head_dim=128,
    query_heads=32,
    context_length=32_768,
    hidden_size=2048,
    active_parameters=3.3e9,
    experts=128,
    experts_per_token=8,
)
"""Qwen3-30B-A3B: 30.5B parameters, 3.3B activated, 32,768 tokens of context natively (model card,
huggingface.co/Qwen/Qwen3-30B-A3B). From its config.json: num_hidden_layers 48, hidden_size 2048,
num_attention_heads 32, num_key_value_heads 4, head_dim 128, num_experts 128, num_experts_per_tok 8,
moe_intermediate_size 768 (one expert: 3 x 2048 x 768 x 48 layers = 226.5M parameters; the counts above
give (30.5 - 3.3)B / 120 = 226.7M), no shared expert, bf16."""

GPT_OSS_120B = ModelSpec(
    "gpt-oss-120b",
    116.8e9,
    layers=36,
    kv_heads=8,
    head_dim=64,
    query_heads=64,
    context_length=131_072,
    hidden_size=2880,
    active_parameters=5.1e9,
    experts=128,
    experts_per_token=4,
    expert_bytes_per_param=MXFP4_BYTES_PER_PARAM,
    sliding_window=128,
    sliding_layers=18,
)
"""gpt-oss-120b: 116.8B parameters, 5.1B active, its MoE weights in MXFP4 (4.25 bits) so that it fits one
80 GB GPU (model card, arXiv 2508.10925, and huggingface.co/openai/gpt-oss-120b). From its config.json:
num_hidden_layers 36, hidden_size 2880, num_attention_heads 64, num_key_value_heads 8, head_dim 64,
num_local_experts 128, experts_per_token 4, sliding_window 128, and layer_types alternating
sliding_attention and full_attention (18 of each), max_position_embeddings 131,072. The rest of the
weights (attention, router, embeddings) are bf16."""

GPT_OSS_20B = replace(
    GPT_OSS_120B,
    name="gpt-oss-20b",
    parameters=20.9e9,
    layers=24,
    active_parameters=3.6e9,
    experts=32,
    sliding_layers=12,
)
"""gpt-oss-20b: 20.9B parameters, 3.6B active, MoE weights in MXFP4 (model card, arXiv 2508.10925, and
huggingface.co/openai/gpt-oss-20b). From its config.json: num_hidden_layers 24, num_local_experts 32,
experts_per_token 4, the attention and the alternating 128-token windows of gpt-oss-120b (12 sliding
layers, 12 full)."""

MIXTRAL_8X7B = ModelSpec(
    "Mixtral-8x7B",
    46.7e9,
    layers=32,
    kv_heads=8,
    head_dim=128,
    query_heads=32,
    context_length=32_768,
    hidden_size=4096,
    active_parameters=12.9e9,
    experts=8,
    experts_per_token=2,
)
"""Mixtral-8x7B: 46.7B parameters, 12.9B used per token (Mistral AI, "Mixtral of experts", December 2023;
Jiang et al., arXiv 2401.04088). From the config.json of huggingface.co/mistralai/Mixtral-8x7B-Instruct-v0.1:
num_hidden_layers 32, hidden_size 4096, num_attention_heads 32, num_key_value_heads 8, intermediate_size
14336, num_local_experts 8, num_experts_per_tok 2, max_position_embeddings 32,768, sliding_window null
(no window), bf16. One expert: 3 x 4096 x 14336 x 32 layers = 5.64B parameters; the counts above give
(46.7 - 12.9)B / 6 = 5.63B."""

SERVED_MODELS: dict[str, ModelSpec] = {
    "deepseek-v3": DEEPSEEK_V3,
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    "gpt-oss-120b": GPT_OSS_120B,
    "gpt-oss-20b": GPT_OSS_20B,
    "mixtral-8x7b": MIXTRAL_8X7B,
}
