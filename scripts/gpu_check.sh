#!/usr/bin/env bash
# GPU check, one run of a few minutes: the correctness tests on CUDA, labkit bench in bf16, the quantized
# schemes (bytes, step time at batch 1, 8, 64, quality) on the default model and, if given, on a local Hugging
# Face checkpoint, then lab 11's Triton kernels compiled (time, bytes and bandwidth against gather+SDPA and
# contiguous SDPA; the engine's tokens with the kernel).
# Usage (on a machine with a CUDA GPU, after `make setup`):  bash scripts/gpu_check.sh [OUT_DIR] [CHECKPOINT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-check}"
mkdir -p "$out"
PY=.venv/bin/python
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device: this script is for a GPU machine'; print(torch.cuda.get_device_name())"
# Correctness: the forward pass against transformers and every policy against solo decoding.
# (fp32 on the GPU so the 1e-4 logit tolerance still means something.)
LABKIT_DEVICE=cuda LABKIT_DTYPE=float32 $PY -m pytest -q tests/test_models.py tests/test_engine_default_model.py \
  2>&1 | tee "$out/tests.txt"
# Speed: the five ways to serve, and the decode-step sweep against this GPU's roofline.
LABKIT_DEVICE=cuda $PY -m labkit.cli bench --dtype bfloat16 --num-prompts 64 --sweep --out "$out/bench_bf16.json" \
  2>&1 | tee "$out/bench_bf16.txt"
# Fewer bytes: weight-only int8 and int4 against the model as loaded, on the default model, then the checkpoint.
LABKIT_DEVICE=cuda $PY scripts/quant_bench.py --out "$out/quant_default.json" 2>&1 | tee "$out/quant_default.txt"
if [ -n "${2:-}" ]; then
  LABKIT_DEVICE=cuda $PY scripts/quant_bench.py --model "$2" --out "$out/quant_checkpoint.json" \
    2>&1 | tee "$out/quant_checkpoint.txt"
fi
# The paged decode kernel compiled (lab 11): its tests on CUDA, then one layer's decode step at batch 1/8/64 and
# contexts 512/4k/32k, SmolLM2's and Llama-3.1-8B's shapes.
LABKIT_DEVICE=cuda $PY -m pytest -q tests/test_lab11_checks.py 2>&1 | tee "$out/kernel_tests.txt"
$PY scripts/kernel_bench.py --out "$out/kernel_bench.json" 2>&1 | tee "$out/kernel_bench.txt"
