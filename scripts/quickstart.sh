#!/usr/bin/env bash
# The main job: set up .venv and run the reference pipeline (datapreproc -> elastic DDP
# training -> evaluation) as an Airflow DAG on local processes, tracked in MLflow (sqlite).
# Outputs go to ./out (override with OUT=/some/dir).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export TORCHX_HOME=${TORCHX_HOME:-$OUT/torchx_home}
exec .venv/bin/python examples/pipelines/airflow/run_local.py --out "$OUT" "$@"
