#!/usr/bin/env bash
# Compare this torchx with upstream torchx 0.7.0 and plain torchrun on this machine; writes RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash benchmarks/setup_upstream.sh
.venv/bin/python benchmarks/bench_cli.py "$@"
