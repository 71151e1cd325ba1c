#!/usr/bin/env bash
# Print the path of torch 2.13.0's CPU wheel, fetched once per machine by pip (from the
# machine's local wheels, pip's config) into one directory. The scripts that make venvs
# (ray_cluster_venv.sh, test_newest.sh) give uv that one path, so uv's cache unpacks torch
# once for all of them (pip unpacked it anew for each venv: ~50 s of CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${TORCHX_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/torchx-wheels}
mkdir -p "$DEST"
exec 9>"$DEST/.lock"
flock 9 # one fetch at a time
if ! ls "$DEST"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
    log=$(mktemp)
    .venv/bin/pip download --quiet --disable-pip-version-check --no-deps --dest "$DEST" \
        torch==2.13.0 2>"$log" || { cat "$log" >&2; rm -f "$log"; exit 1; }
    rm -f "$log"
fi
wheel=$(ls "$DEST"/torch-2.13.0+cpu-*.whl 2>/dev/null | head -n 1)
if [ -z "$wheel" ]; then
    echo "torch_wheel: pip found no CPU wheel of torch 2.13.0 (in $DEST: $(ls "$DEST")); give it one through pip's find-links" >&2
    exit 1
fi
echo "$wheel"
