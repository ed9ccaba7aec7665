#!/usr/bin/env bash
# GPU check: what only a GPU can show, in one run of a few minutes, each step reported and one summary at the end.
#   1. the environment: nvidia-smi, torch and Triton, labkit info;
#   2. correctness on CUDA: the forward pass against transformers, every policy against solo decoding (fp32);
#   3. lab 11's checks and notebook (pytest -m lab11), the kernels compiled and run on the card;
#   4. labkit's device choice on the card (tests/test_device*.py; the stand-in walk of every lab's checks,
#      tests/test_check_devices.py, is for machines without a GPU and skips here);
#   5. every kernel compiled for this card (scripts/compile_kernels.py, where present);
#   6. scripts/kernel_bench.py: the kernel against gather+SDPA and SDPA, its share of the card's peak, and the
#      default model's tokens/s in the engine with the kernel against SDPA;
#   7. labkit bench in bf16 (the five ways to serve, the decode sweep), a short engine throughput run;
#   8. scripts/quant_bench.py on the default model and, if given, on a local Hugging Face checkpoint.
# A step that fails is recorded and the next one still runs; the exit status is 1 if any step failed.
# --dry-run runs every step on this CPU: tiny shapes, Triton's interpreter, the CUDA-only tests skipped (CI runs it,
# tests/test_gpu_check_script.py), so a GPU session finds no mistake of the script's own.
# Usage, from the repository root of a GPU machine after `make setup` (PYTHON=... to use another interpreter):
#   bash scripts/gpu_check.sh [--dry-run] [OUT_DIR] [CHECKPOINT_DIR]
set -uo pipefail # no -e: a failed step must not stop the ones after it
cd "$(dirname "$0")/.."

dry=0
positional=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry=1 ;;
    -h | --help) sed -n '2,16p' "$0" | cut -c3-; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $arg (--dry-run, --help)" >&2; exit 2 ;;
    *) positional+=("$arg") ;;
  esac
done
checkpoint="${positional[1]:-}"
PY="${PYTHON:-.venv/bin/python}"
# found, not imported: torch's import takes seconds, and the first step imports it anyway
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('labkit') and u.find_spec('torch')))" \
  2>/dev/null; then
  echo "gpu_check.sh: $PY cannot import labkit and torch: run 'make setup' first (or set PYTHON)" >&2
  exit 2
fi
if [ "$dry" = 1 ]; then
  out="${positional[0]:-gpu-check-dry-run}"
  export LABKIT_DEVICE=cpu CUDA_VISIBLE_DEVICES="" # the CPU, even on a machine with a GPU
  # oneDNN's prepacked weights are a CPU path that a GPU never takes: not worth seconds in every model load here
  export LABKIT_PREPACK=0
else
  out="${positional[0]:-gpu-check}"
  export LABKIT_DEVICE=cuda
  if ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "gpu_check.sh: torch sees no CUDA device here; 'bash scripts/gpu_check.sh --dry-run' runs every step on" \
      "the CPU (the README's 'On a GPU' says how to get a CUDA build of torch)" >&2
    exit 2
  fi
fi
mkdir -p "$out"

names=()
verdicts=()
# step NAME LOG COMMAND...: run COMMAND, show its output and keep it in $out/LOG, record whether it passed and
# how long it took
step() {
  local name="$1" log="$out/$2"
  shift 2
  echo
  echo "=== step $((${#names[@]} + 1)): $name"
  local started="$SECONDS"
  "$@" 2>&1 | tee "$log"
  local status="${PIPESTATUS[0]}" took="$((SECONDS - started)) s"
  names+=("$name")
  if [ "$status" = 0 ]; then verdicts+=("passed ($took)"); else verdicts+=("FAILED (exit $status; $log; $took)"); fi
}
# skip NAME WHY: a step that cannot run here, recorded as such
skip() {
  echo
  echo "=== step $((${#names[@]} + 1)): $1: skipped ($2)"
  names+=("$1")
  verdicts+=("skipped: $2")
}

environment() {
  local status=0
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi || status=1; else echo "nvidia-smi: none"; fi
  "$PY" -c "
import torch
try:
    import triton
    triton_version = triton.__version__
except ImportError:
    triton_version = 'not installed'
print(f'torch {torch.__version__} (CUDA build: {torch.version.cuda or \"no\"}), triton {triton_version}')
print('CUDA device:', torch.cuda.get_device_name() if torch.cuda.is_available() else 'none')" || status=1
  "$PY" -m labkit.cli info || status=1
  return "$status"
}

if [ "$dry" = 1 ]; then
  # small: each step's command as on the GPU, on a test or a size that takes a second or two (`make test` runs
  # every test these select from, and the whole compile table: tests/test_compile_kernels_script.py)
  correctness=(-k "ragged_batch_equals_separate_sequences")
  lab11=(tests/test_lab11_checks.py -k "byte_counts_follow_the_two_paths_reads")
  device=(-k "cpu_features or threads_leave_one_core")
  kernel_args=(--quick)
  compile_args=(--quick)
  bench_args=(--num-prompts 1 --max-prompt-tokens 48 --max-output-tokens 2)
  quant_args=(--batches 1 --context 16 --repeats 1 --rounds 1 --prompts 0 --no-bf16 --no-w8a8)
else
  correctness=()
  lab11=(tests)
  device=()
  kernel_args=()
  compile_args=()
  bench_args=(--dtype bfloat16 --num-prompts 64 --sweep)
  quant_args=()
fi

step "environment" environment.txt environment
step "correctness on $LABKIT_DEVICE (fp32)" tests.txt env LABKIT_DTYPE=float32 \
  "$PY" -m pytest -q -p no:cacheprovider tests/test_models.py tests/test_engine_default_model.py "${correctness[@]}"
# this script's own test is marked lab11 too: left out, or the dry run would run itself
step "lab 11's checks and notebook (pytest -m lab11)" lab11.txt \
  "$PY" -m pytest -q -p no:cacheprovider -m lab11 --ignore=tests/test_gpu_check_script.py "${lab11[@]}"
shopt -s nullglob
device_tests=(tests/test_device*.py)
shopt -u nullglob
if [ "${#device_tests[@]}" -gt 0 ]; then
  step "device walk (${device_tests[*]})" device.txt "$PY" -m pytest -q -p no:cacheprovider "${device_tests[@]}" \
    "${device[@]}"
else
  skip "device walk" "no tests/test_device*.py in this checkout"
fi
if [ -f scripts/compile_kernels.py ]; then
  step "kernels compiled (scripts/compile_kernels.py)" compile_kernels.txt "$PY" scripts/compile_kernels.py \
    "${compile_args[@]}"
else
  skip "kernels compiled" "no scripts/compile_kernels.py in this checkout"
fi
step "kernel bench (scripts/kernel_bench.py)" kernel_bench.txt \
  "$PY" scripts/kernel_bench.py "${kernel_args[@]}" --out "$out/kernel_bench.json"
step "engine throughput (labkit bench)" bench.txt \
  "$PY" -m labkit.cli bench "${bench_args[@]}" --out "$out/bench.json"
step "quantized weights (scripts/quant_bench.py, default model)" quant_default.txt \
  "$PY" scripts/quant_bench.py "${quant_args[@]}" --out "$out/quant_default.json"
if [ -n "$checkpoint" ]; then
  step "quantized weights ($checkpoint)" quant_checkpoint.txt \
    "$PY" scripts/quant_bench.py --model "$checkpoint" "${quant_args[@]}" --out "$out/quant_checkpoint.json"
fi

echo
echo "=== summary ($([ "$dry" = 1 ] && echo "dry run on the CPU" || echo "on the GPU"); logs in $out/)"
failed=0
for i in "${!names[@]}"; do
  printf '  %-60s %s\n' "${names[$i]}" "${verdicts[$i]}"
  case "${verdicts[$i]}" in FAILED*) failed=1 ;; esac
done
"$PY" - "$out/kernel_bench.json" <<'EOF'
"""The kernel's share of the card's peak and the engine's tokens/s with the kernel against SDPA, from the bench."""
import json
import sys

try:
    with open(sys.argv[1]) as file:
        bench = json.load(file)
except (OSError, ValueError) as error:
    sys.exit(f"  kernel bench: no results ({error})")
rows = [row for row in bench["rows"] if "error" not in row]
shares = [row["kernel_of_peak"] for row in rows if "kernel_of_peak" in row]
if shares:
    best = max(rows, key=lambda row: row["kernel_of_peak"])
    card = bench["card"]
    print(
        f"  kernel: {min(shares):.0%} to {max(shares):.0%} of {card['name']}'s peak "
        f"({card['peak'] / 1e12:.2f} TB/s, {card['peak_source']}); best at {best['model']} batch {best['batch']} "
        f"context {best['context']}; a copy measures {card['measured_copy'] / 1e12:.2f} TB/s"
    )
    for row in rows:
        if row.get("warning"):
            print(f"  {row['model']} batch {row['batch']} context {row['context']}: {row['warning']}")
else:
    print(f"  kernel: {bench['device']} (no share of a peak)")
failures = len(bench["rows"]) - len(rows)
if failures:
    print(f"  kernel bench: {failures} case(s) failed (see kernel_bench.txt)")
engine = bench.get("engine", {})
if "error" in engine or not engine:
    print(f"  engine: no figures ({engine.get('error', 'not run')})")
else:
    print(
        f"  engine: {engine['kernel_tokens_per_s']:.1f} tokens/s with the kernel, {engine['sdpa_tokens_per_s']:.1f} "
        f"with SDPA ({engine['kernel_tokens_per_s'] / engine['sdpa_tokens_per_s']:.2f}x); greedy tokens agree: "
        f"{engine['tokens_agree']}" + ("" if bench["card"] else f"  [{bench['device']}]")
    )
EOF
if [ "$failed" = 1 ]; then echo "gpu_check: some steps FAILED"; else echo "gpu_check: every step passed or was skipped"; fi
exit "$failed"
