#!/usr/bin/env bash
# Print the path of a venv for a Ray cluster "on another host": torch, ray and a
# non-editable copy of this tree's torchx (torchx[ray]), as a Ray cluster has its own
# Python with torchx installed. It lives outside the tree (the tests hide the tree from
# the cluster) and is reused: built once per pyproject/constraints/this script, torchx
# reinstalled (no deps, ~2 s) whenever its source changed. uv installs torch from the
# machine's one copy of its wheel (scripts/torch_wheel.sh) and nothing is byte-compiled
# ahead: the cluster's processes, whose env has no PYTHONDONTWRITEBYTECODE, compile what
# they import once. (pip and --compile-bytecode took 67 s on a quiet machine, 300 s in a
# loaded test run; this takes 15 s, and the first `import torch, ray` 5 s more.)
set -euo pipefail
cd "$(dirname "$0")/.."
TREE=$(pwd)
PY=${PYTHON:-python3}
KEY=$(cat pyproject.toml constraints.txt scripts/ray_cluster_venv.sh <(echo "$TREE") |
    sha256sum | cut -c1-12)
V=${TORCHX_RAY_CLUSTER_VENV:-/tmp/torchx-ray-cluster-$KEY}
exec 9>"$V.lock"
flock 9 # one builder at a time (parallel test runs on one machine)
SRC=$(find torchx pyproject.toml -name '*.py' -o -name '*.toml' | LC_ALL=C sort |
    xargs cat | sha256sum | cut -c1-12)
BUILD=""
copy_tree() {
    # torchx is built from a copy of the tree: a build in the tree writes torchx.egg-info
    # there, and while it exists Airflow's plugin loading in the tests (run in the tree)
    # trips on it. Copied only when something is built (most calls build nothing).
    [ -n "$BUILD" ] && return
    BUILD=$(mktemp -d)
    trap 'rm -rf "$BUILD"' EXIT
    tar -C "$TREE" --exclude=__pycache__ -cf - pyproject.toml README.md torchx examples |
        tar -C "$BUILD" -xf -
}
if [ ! -f "$V/.deps-ready" ]; then
    copy_tree
    rm -rf "$V"
    TORCH_WHEEL=$(bash scripts/torch_wheel.sh)
    "$PY" -m venv "$V"
    .venv/bin/uv pip install --quiet --python "$V/bin/python" -c constraints.txt \
        "$TORCH_WHEEL" "$BUILD[ray]" >&2
    echo "$SRC" >"$V/.torchx-src"
    touch "$V/.deps-ready"
fi
if [ "$(cat "$V/.torchx-src" 2>/dev/null)" != "$SRC" ]; then
    # this tree's torchx changed: rebuild it (uv would reuse its cached build otherwise)
    copy_tree
    .venv/bin/uv pip install --quiet --python "$V/bin/python" --no-deps --refresh-package torchx \
        --reinstall-package torchx "$BUILD" >&2
    echo "$SRC" >"$V/.torchx-src"
fi
echo "$V"
