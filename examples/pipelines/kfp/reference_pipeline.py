"""The reference pipeline for Kubeflow Pipelines v2: datapreproc -> elastic DDP train -> evaluate.

Every stage runs through ``torchx_launcher``, so the training stage can be a multi-node
elastic job on any scheduler (``kubernetes``, ``slurm``, ``local_cwd``). Data moves as
URLs under ``base_dir``; lineage is recorded under one tracker run per pipeline run, and
each launcher returns its stage's MLflow run id and typed ``Model``/``Dataset``/``Metrics``.

The component file is fixed when the pipeline is built (``$TORCHX_EXAMPLE_COMPONENTS``,
default ``examples/components.py`` here), so each task's resources (one node's cpu and
memory) are in the compiled IR. For a cluster, build with the path the launcher's image
has (``TORCHX_KFP_BASE_IMAGE`` names that image).

Compile:  python -m torchx.pipelines.kfp.compile \
examples/pipelines/kfp/reference_pipeline.py:reference_pipeline pipeline.yaml
Run here: python examples/pipelines/kfp/run_local.py --out ./out-kfp
"""

import os

from kfp import dsl

from torchx.pipelines.kfp.components import (
    close_pipeline_run,
    start_pipeline_run,
    torchx_launcher,
)

COMPONENTS = os.environ.get("TORCHX_EXAMPLE_COMPONENTS") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "components.py")
)


@dsl.pipeline(
    name="torchx-reference",
    description="datapreproc -> elastic DDP train -> evaluate, each a torchx job",
)
def reference_pipeline(
    base_dir: str,
    scheduler: str = "local_cwd",
    j: str = "1:2x1",
    epochs: str = "20",
    limit: str = "0",
    train_cfg: dict = {},  # noqa: B006
) -> None:
    components = COMPONENTS
    run = start_pipeline_run(
        pipeline_name="torchx-reference", job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER
    )
    run.set_caching_options(False)
    data, model, evaluation = f"{base_dir}/data", f"{base_dir}/model", f"{base_dir}/eval"
    # a retried step re-attaches to its app: the key is the pipeline job id + the task name
    identity = dict(
        job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER
    )
    # ends the tracker run with the pipeline: FINISHED, FAILED or KILLED
    close = close_pipeline_run(
        pipeline_name="torchx-reference", job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER
    )
    close.set_caching_options(False)
    with dsl.ExitHandler(close):
        prep = torchx_launcher(
            component=f"{components}:datapreproc",
            component_args=["--output_path", data, "--limit", limit],
            scheduler=scheduler,
            parent_run_id=run.output,
            **identity,
        )
        train = torchx_launcher(
            component=f"{components}:trainer",
            component_args=[
                "--data_path",
                data,
                "--output_path",
                model,
                "--checkpoint_path",
                f"{base_dir}/checkpoints",
                "-j",
                j,
                "--epochs",
                epochs,
            ],
            scheduler=scheduler,
            cfg=train_cfg,
            parent_run_id=run.output,
            **identity,
        ).after(prep)
        evaluate = torchx_launcher(
            component=f"{components}:evaluate",
            component_args=[
                "--model_path",
                model,
                "--data_path",
                data,
                "--output_path",
                evaluation,
            ],
            scheduler=scheduler,
            parent_run_id=run.output,
            **identity,
        ).after(train)
    for task in (prep, train, evaluate):
        task.set_caching_options(False)
