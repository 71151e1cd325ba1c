#!/usr/bin/env bash
# Print the path of torch 2.13.0's CPU wheel, fetched once per machine by pip into one
# directory: from pip's own sources (this machine's local wheels), else PyTorch's CPU index.
# The venvs (ray_cluster_venv.sh, test_newest.sh) and docker_engine.sh's torch image all
# take it from that one path, so uv's cache unpacks torch once for the venvs (pip unpacked
# it anew for each: ~50 s of CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${TORCHX_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/torchx-wheels}
mkdir -p "$DEST"
exec 9>"$DEST/.lock"
flock 9 # one fetch at a time
found() { ls "$DEST"/torch-2.13.0+cpu-*.whl 2>/dev/null | head -n 1 || true; }
if [ -z "$(found)" ]; then
    log="$DEST/pip.log"
    : >"$log"
    for index in "" "--index-url=https://download.pytorch.org/whl/cpu"; do
        # +cpu: a source without the CPU build fails here rather than fetch another build
        .venv/bin/pip download --quiet --disable-pip-version-check --no-deps --dest "$DEST" \
            ${index:+"$index"} "torch==2.13.0+cpu" 2>>"$log" && break || true
    done
fi
wheel=$(found)
if [ -z "$wheel" ]; then
    cat "$DEST/pip.log" >&2
    echo "torch_wheel: pip found no CPU wheel of torch 2.13.0; give it one through pip's find-links" >&2
    exit 1
fi
echo "$wheel"
