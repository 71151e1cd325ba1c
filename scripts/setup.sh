#!/usr/bin/env bash
# Create ./.venv with torchx and every extra, pinned by constraints.txt.
# torch is installed first with pip (the CPU wheel on local disk), then uv
# resolves the rest keeping that torch, so no CUDA build is ever downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch, uv" 2>/dev/null; then
    .venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0 uv
fi
.venv/bin/uv pip install --quiet --python .venv/bin/python \
    -c constraints.txt torch==2.13.0 -e '.[dev]'
# byte-compile like pip does for installed packages (an editable install otherwise
# recompiles every module on each start when PYTHONDONTWRITEBYTECODE is set)
.venv/bin/python -m compileall -q torchx examples >/dev/null || true
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
