"""What labkit's decode kernels take and give, known without importing Triton (checks and scripts read it).

- :data:`GPU_SIGNATURES`: each kernel's parameters as Triton types, with its constants, at Llama-3.1-8B's
  shapes in bf16 (32 query heads, 8 KV heads, head_dim 128, blocks of 16, 16 splits): what
  :mod:`~labkit.kernels.compile_for_gpu` compiles them with for a GPU target;
- :data:`UNWRITTEN`: what an output holds until a kernel writes it (no attention output comes near it), so a
  check can name the rows a kernel never wrote.
"""

from __future__ import annotations

UNWRITTEN = -1.0e30

_DECODE_ARGS = {"q_ptr": "*bf16", "k_pool_ptr": "*bf16", "v_pool_ptr": "*bf16", "block_tables_ptr": "*i32"}
_DECODE_ARGS |= {"context_lens_ptr": "*i32", "scale": "fp32", "max_blocks_per_seq": "i32"}
_SHAPES = {"GROUP": 4, "GROUP_PAD": 4, "NUM_KV_HEADS": 8, "BLOCK_SIZE": 16, "HEAD_DIM": 128}
_PARTIALS = {"max_out_ptr": "*fp32", "sum_out_ptr": "*fp32", "acc_out_ptr": "*fp32"}
GPU_SIGNATURES: dict[str, tuple[dict[str, str], dict[str, int]]] = {
    "paged_decode_kernel": ({"out_ptr": "*bf16", **_DECODE_ARGS} | dict.fromkeys(_SHAPES, "constexpr"), _SHAPES),
    "split_kv_kernel": (
        {**_PARTIALS, **_DECODE_ARGS, "blocks_per_split": "i32"} | dict.fromkeys(["NUM_SPLITS", *_SHAPES], "constexpr"),
        {"NUM_SPLITS": 16, **_SHAPES},
    ),
    "merge_splits_kernel": (
        {"out_ptr": "*bf16", "max_ptr": "*fp32", "sum_ptr": "*fp32", "acc_ptr": "*fp32"}
        | dict.fromkeys(["NUM_SPLITS", "SPLITS_PAD", "HEAD_DIM"], "constexpr"),
        {"NUM_SPLITS": 16, "SPLITS_PAD": 16, "HEAD_DIM": 128},
    ),
}
