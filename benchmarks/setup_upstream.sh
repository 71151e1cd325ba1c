#!/usr/bin/env bash
# A separate venv with upstream torchx 0.7.0 (and the same torch) to compare against.
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venvs/upstream
if [ ! -x "$VENV/bin/torchx" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0 uv
    "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" torch==2.13.0 torchx==0.7.0
fi
echo "upstream: $("$VENV/bin/python" -c 'import torchx; print("torchx", torchx.__version__)')"
