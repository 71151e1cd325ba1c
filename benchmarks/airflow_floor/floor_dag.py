"""``bench_pipeline.py``'s ``airflow floor``: the reference pipeline's three bare commands as
a DAG of plain Airflow tasks, one per stage, without torchx. It lives in a DAG folder of its
own because ``dag.test()`` parses the DAG folder; the run's directory (its ``stages.json``)
comes from ``$BENCH_FLOOR_OUT``."""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, task

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_pipeline import floor_stage  # noqa: E402

OUT = os.environ.get("BENCH_FLOOR_OUT", ".")

with DAG(
    "torchx_bench_floor", schedule=None, start_date=datetime(2026, 1, 1), catchup=False
) as dag:
    previous = None
    for index in range(3):  # datapreproc, train, evaluate
        current = task(task_id=f"stage{index}")(floor_stage)(OUT, index)
        if previous is not None:
            previous >> current
        previous = current
