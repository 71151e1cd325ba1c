"""DAGs of the Airflow deployment tests: one torchx stage that waits for a flag file.

The stage's job polls for ``dag_run.conf["flag"]`` and ends when the test creates it, so
a test decides when the app succeeds (no guessing how long a crash takes to handle).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from torchx.pipelines.airflow import TorchXOperator, close_pipeline_run

WAIT = "while [ ! -e {{ dag_run.conf['flag'] }} ]; do sleep 0.1; done; echo flag-seen"

for dag_id, deferrable in (("torchx_wait", False), ("torchx_wait_deferred", True)):
    with DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        on_success_callback=close_pipeline_run,
        on_failure_callback=close_pipeline_run,
    ) as dag:
        TorchXOperator(
            task_id="job",
            component="utils.sh",
            component_args=["sh", "-c", WAIT],
            deferrable=deferrable,
            poll_interval=0.5,
            retries=1,
            retry_delay=timedelta(seconds=1),
        )
    globals()[dag_id] = dag
