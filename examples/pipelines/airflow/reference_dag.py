"""The reference pipeline as an Airflow DAG: datapreproc -> elastic DDP train -> evaluate.

Each stage is a ``TorchXOperator`` running a component of ``examples/components.py``
through the torchx Runner, so the same DAG runs on any scheduler: change the
``scheduler`` and ``train_cfg`` params (e.g. ``slurm`` with ``{"partition": "debug"}``).
The job handles travel between tasks as XComs; the last task reports them.

Lineage needs no wiring here: each stage records what it wrote and read
(``torchx.trackers.record_output`` / ``record_input``), and each ``TorchXOperator`` turns
that into an event on the stage's stable Asset ``x-torchx://<dag_id>/<task_id>`` (the
run's output path in its extra) and
OpenLineage input/output datasets with a run facet naming the stage's MLflow run. Turn
OpenLineage on with any transport, e.g.
``AIRFLOW__OPENLINEAGE__TRANSPORT='{"type": "console"}'``.
"""

from __future__ import annotations

import json
import os
from datetime import datetime

from airflow.sdk import DAG, Param, task

from torchx.pipelines.airflow import TorchXOperator, close_pipeline_run

COMPONENTS = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "components.py")
COMPONENTS = os.path.abspath(COMPONENTS)
RUN_DIR = "{{ params.base_dir }}/{{ run_id | replace(':', '_') | replace('+', '_') }}"

with DAG(
    dag_id="torchx_reference_pipeline",
    description="datapreproc -> elastic DDP training -> evaluation, each stage a torchx job",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    render_template_as_native_obj=True,
    params={
        "base_dir": Param(
            os.path.abspath("out/pipeline"), type="string", description="where stage outputs go"
        ),
        "scheduler": Param(
            "local_cwd", type="string", description="torchx scheduler for every stage"
        ),
        "train_cfg": Param(
            {}, type="object", description="scheduler run options of the training stage"
        ),
        "j": Param("1:2x1", type="string", description="nodes and processes of the training stage"),
        "epochs": Param(20, type="integer"),
        "limit": Param(0, type="integer", description="rows of data to use (0: all)"),
    },
    tags=["torchx"],
    on_success_callback=close_pipeline_run,  # the DAG run's tracker run ends FINISHED
    on_failure_callback=close_pipeline_run,  # ... or FAILED
) as dag:
    datapreproc = TorchXOperator(
        task_id="datapreproc",
        component=f"{COMPONENTS}:datapreproc",
        component_args={"output_path": f"{RUN_DIR}/data", "limit": "{{ params.limit or None }}"},
        scheduler="{{ params.scheduler }}",
    )
    train = TorchXOperator(
        task_id="train",
        component=f"{COMPONENTS}:trainer",
        component_args={
            "data_path": f"{RUN_DIR}/data",
            "output_path": f"{RUN_DIR}/model",
            "checkpoint_path": f"{RUN_DIR}/checkpoints",
            "j": "{{ params.j }}",
            "epochs": "{{ params.epochs }}",
        },
        scheduler="{{ params.scheduler }}",
        cfg="{{ params.train_cfg }}",
    )
    evaluate = TorchXOperator(
        task_id="evaluate",
        component=f"{COMPONENTS}:evaluate",
        component_args={
            "model_path": f"{RUN_DIR}/model",
            "data_path": f"{RUN_DIR}/data",
            "output_path": f"{RUN_DIR}/eval",
        },
        scheduler="{{ params.scheduler }}",
    )

    @task
    def report(prep_handle: str, train_handle: str, eval_handle: str, run_dir: str) -> dict:
        """Summarise the run: the three job handles (from XCom) and the test accuracy."""
        with open(os.path.join(run_dir, "eval", "metrics.json")) as f:
            accuracy = json.load(f)["test_accuracy"]
        summary = {
            "datapreproc": prep_handle,
            "train": train_handle,
            "evaluate": eval_handle,
            "test_accuracy": accuracy,
        }
        print(json.dumps(summary, indent=2))
        return summary

    datapreproc >> train >> evaluate
    report(datapreproc.output, train.output, evaluate.output, RUN_DIR)
