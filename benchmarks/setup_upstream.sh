#!/usr/bin/env bash
# Two venvs to compare, installed the same way (non-editable, byte-compiled, as `pip install`
# leaves a package): upstream torchx 0.7.0, and this checkout. Same torch (CPU wheel).
# An editable install (the dev .venv) pays for its import hook at every start, and a tree
# without __pycache__ (PYTHONDONTWRITEBYTECODE=1) compiles every module at every start:
# neither is what a user runs, so the CLI benchmark uses these venvs.
set -euo pipefail
cd "$(dirname "$0")"
ROOT="$(cd .. && pwd)"
make_venv() {  # dir, packages...
    local venv="$1"
    shift
    if [ ! -x "$venv/bin/uv" ]; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0 uv
    fi
    "$venv/bin/uv" pip install --quiet --compile-bytecode --python "$venv/bin/python" \
        torch==2.13.0 "$@"
}
make_venv .venvs/upstream torchx==0.7.0
if [ ! -f .venvs/upstream/.compiled ]; then  # installed before --compile-bytecode was used
    .venvs/upstream/bin/python -m compileall -q .venvs/upstream/lib/python3.11/site-packages/torchx
    touch .venvs/upstream/.compiled
fi
# ours: always reinstalled from the checkout, so the benchmark measures this tree
make_venv .venvs/ours --reinstall-package torchx "$ROOT[docker]"
echo "upstream: $(.venvs/upstream/bin/python -c 'import torchx; print("torchx", torchx.__version__, torchx.__file__)')"
echo "ours:     $(.venvs/ours/bin/python -c 'import torchx; print("torchx", torchx.__version__, torchx.__file__)')"
