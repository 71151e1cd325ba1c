#!/usr/bin/env bash
# The test command: set up .venv (idempotent) and run the whole suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/specs -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
# A throwaway local Slurm cluster for the Slurm tests (root + apt only; skipped otherwise).
# It starts while the linters run.
slurm=""
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null && [ -x scripts/slurm_cluster.sh ]; then
    if bash scripts/slurm_cluster.sh install; then
        bash scripts/slurm_cluster.sh start &
        slurm=$!
        trap 'wait "$slurm" 2>/dev/null; bash scripts/slurm_cluster.sh stop || true' EXIT
    else
        echo "test: Slurm packages unavailable; Slurm tests will be skipped" >&2
    fi
fi
if [ $# -eq 0 ]; then
    .venv/bin/ruff check torchx tests examples benchmarks
    .venv/bin/ruff format --check --quiet torchx tests examples benchmarks
    .venv/bin/mypy torchx
fi
if [ -n "$slurm" ]; then
    if wait "$slurm"; then
        eval "$(bash scripts/slurm_cluster.sh env)"
    else
        echo "test: local Slurm cluster unavailable; Slurm tests will be skipped" >&2
    fi
fi
# Five workers on 2 CPUs: half the suite waits on processes, Slurm or servers; two workers
# run the scopes that mostly wait, three the rest, so the 2 CPUs stay busy (2026-11-27:
# 6:03 against 6:30 with four, where a third of the run kept them 60-90 % busy). Tests that
# share the Slurm cluster or the Ray head stay on one worker (tests/conftest.py).
# TORCHX_TEST_WORKERS=0: serial.
.venv/bin/python -m pytest -q -n "${TORCHX_TEST_WORKERS:-5}" --durations=25 "$@"
