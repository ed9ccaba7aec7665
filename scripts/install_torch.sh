#!/usr/bin/env bash
# Install PyTorch into the course's environment, unless it already has one (a GPU user keeps their own).
# Without an NVIDIA GPU, take the CPU build from PyTorch's own CPU wheel index when it is reachable:
# on a stock Linux pip the default index resolves to the multi-GB CUDA build. Otherwise fall back to
# the default index (on the course's machines it serves the CPU build). Says which build it got.
# pip chooses the wheels (it reads this machine's pip configuration: mirrors, find-links, constraints);
# uv, when the environment has it, installs exactly those, unpacking and byte-compiling on every core
# (about 20 s instead of pip's 40 on 2 cores). Without uv, or if uv fails, pip installs them itself.
# With a CPU build of torch it also installs Triton (third argument), whose interpreter runs lab 11's kernels
# on the CPU: the version tested with this torch. A CUDA build of torch brings its own Triton, which stays.
#   usage: scripts/install_torch.sh PYTHON "torch==2.13.0" "triton==3.8.0"
set -euo pipefail
py="$1"; torch_spec="$2"; triton_spec="${3:-}"
cpu_index="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
uv="$(dirname "$py")/uv"

# pip_install [pip options] SPEC: what pip would install, installed by uv where it can be.
pip_install() {
  if [ -x "$uv" ]; then
    local wheels
    wheels=$("$py" -m pip install --dry-run --quiet --report - "$@" \
      | "$py" -c "import json, sys; print(' '.join(i['download_info']['url'] for i in json.load(sys.stdin)['install']))") \
      && "$uv" pip install -q --python "$py" --no-deps --compile-bytecode $wheels && return
    echo "torch: uv could not install pip's choice; pip installs it"
  fi
  "$py" -m pip install -q "$@"
}

if ! "$py" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "torch: an NVIDIA GPU is here; installing $torch_spec from the default index (a CUDA build)"
    pip_install "$torch_spec"
  elif "$py" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)" "$cpu_index/" 2>/dev/null; then
    echo "torch: no GPU; installing $torch_spec from PyTorch's CPU index $cpu_index"
    pip_install --index-url "$cpu_index" "$torch_spec"
  else
    echo "torch: no GPU, and $cpu_index is not reachable; installing $torch_spec from the default index"
    pip_install "$torch_spec"
  fi
fi
"$py" -c "import torch; cuda = torch.version.cuda; print(f'torch {torch.__version__}:', f'CUDA {cuda} build' if cuda else 'CPU build')"
if [ -n "$triton_spec" ] && "$py" -c "import sys, torch; sys.exit(bool(torch.version.cuda))" 2>/dev/null \
  && ! "$py" -c "import triton" 2>/dev/null; then
  echo "triton: a CPU build of torch; installing $triton_spec for its interpreter (lab 11's kernels)"
  pip_install "$triton_spec"
fi
