#!/usr/bin/env bash
# The test command: set up .venv (idempotent) and run the whole suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/specs -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
# A throwaway local Slurm cluster for the Slurm tests (root + apt only; skipped otherwise).
# It starts while the linters run. A cluster or engine that already ran (another checkout's
# run, a developer's) is used and left running: only what this run started is stopped.
slurm=""
slurm_stop=1
docker_stop=1
bash scripts/slurm_cluster.sh status >/dev/null 2>&1 && slurm_stop=""
bash scripts/docker_engine.sh status 2>/dev/null && docker_stop=""
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null && [ -x scripts/slurm_cluster.sh ]; then
    if bash scripts/slurm_cluster.sh install; then
        bash scripts/slurm_cluster.sh start &
        slurm=$!
    else
        echo "test: Slurm packages unavailable; Slurm tests will be skipped" >&2
    fi
fi
# A private Docker engine for the container tests (local_docker, Docker workspaces, KFP's
# DockerRunner): Debian's docker.io, its own dockerd, a loopback registry, base images made
# from Debian's packages once per machine, and torchx's image built from this tree
# (scripts/docker_engine.sh; root + apt only; skipped otherwise). Also while the linters run.
docker=""
engine=""
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null && bash scripts/docker_engine.sh install; then
    engine=1
    mkdir -p .test-logs
    (bash scripts/docker_engine.sh start && bash scripts/docker_engine.sh images) \
        >.test-logs/docker_engine.log 2>&1 &
    docker=$!
else
    echo "test: Docker packages unavailable; container tests will be skipped" >&2
fi
cleanup() {
    [ -n "$slurm" ] && { wait "$slurm" 2>/dev/null; [ -z "$slurm_stop" ] || bash scripts/slurm_cluster.sh stop || true; }
    [ -n "$engine" ] && { wait "$docker" 2>/dev/null; [ -z "$docker_stop" ] || bash scripts/docker_engine.sh stop || true; }
}
trap cleanup EXIT
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
if [ -n "$docker" ]; then
    if wait "$docker"; then
        eval "$(bash scripts/docker_engine.sh env)"
        export TORCHX_TEST_DOCKER=1   # the container tests fail, not skip, without the engine
        echo "test: Docker engine ready ($(tail -n 1 .test-logs/docker_engine.log))" >&2
    else
        cat .test-logs/docker_engine.log >&2
        echo "test: Docker engine unavailable; container tests will be skipped" >&2
    fi
fi
# Five workers on 2 CPUs: half the suite waits on processes, Slurm or servers; two workers
# run the scopes that mostly wait, three the rest, so the 2 CPUs stay busy (2026-11-27:
# 6:03 against 6:30 with four, where a third of the run kept them 60-90 % busy). Tests that
# share the Slurm cluster or the Ray head stay on one worker (tests/conftest.py).
# TORCHX_TEST_WORKERS=0: serial.
.venv/bin/python -m pytest -q -n "${TORCHX_TEST_WORKERS:-5}" --durations=25 "$@"
