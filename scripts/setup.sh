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
# what the install depends on: when it has not changed since the last full install, the
# install is skipped (resolving and checking every package again took 3-4 s of each test run)
STAMP=.venv/.torchx-setup-stamp
WANT=$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    rm -f "$STAMP"
    if ! .venv/bin/python -c "import torch, uv" 2>/dev/null; then
        .venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0 uv
    fi
    # --compile-bytecode: byte-compile what uv installs, as pip does. Without it, where
    # PYTHONDONTWRITEBYTECODE is set (it is on these machines), every process recompiles
    # each module it imports from source: `import mlflow` 4.4 s of CPU instead of 2.0.
    .venv/bin/uv pip install --quiet --python .venv/bin/python --compile-bytecode \
        -c constraints.txt torch==2.13.0 -e '.[dev]'
    echo "$WANT" > "$STAMP"
fi
# the editable build leaves a copy of torchx's metadata in the tree (torchx.egg-info); with
# the tree on sys.path (python -m pytest) torchx's airflow.plugins entry point is seen twice,
# and Airflow's task SDK 1.3.2 stops loading entry-point plugins at a duplicate name (it
# skipped OpenLineage's listener in dag.test()). The installed metadata is in .venv.
rm -rf torchx.egg-info
# the editable torchx and the examples are not installed files: compile them here
.venv/bin/python -m compileall -q torchx examples >/dev/null || true
echo "setup: .venv ready (torch $(.venv/bin/python -c 'from importlib.metadata import version; print(version("torch"))'))"
