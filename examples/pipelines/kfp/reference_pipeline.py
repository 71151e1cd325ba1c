"""The reference pipeline for Kubeflow Pipelines v2: datapreproc -> elastic DDP train -> evaluate.

Every stage runs through ``torchx_launcher``, so the training stage can be a multi-node
elastic job on any scheduler (``kubernetes``, ``slurm``, ``local_cwd``). Data moves as
URLs under ``base_dir``; lineage is recorded under one tracker run per pipeline run, and
each launcher returns its stage's MLflow run id and typed ``Model``/``Dataset``/``Metrics``.

The launchers name the stage components by module path, ``examples.components``: the
same name on the compiling machine (where it gives each task its resources, one node's cpu
and memory, in the compiled IR) and in torchx's image, which installs the ``examples``
package, so the compiled pipeline holds no path of the compiling machine. An image that
has the components elsewhere: ``$TORCHX_EXAMPLE_COMPONENTS`` (``module`` or
``/path/in/image/components.py``) when building; the resources still come from
``examples.components`` here. ``TORCHX_KFP_BASE_IMAGE`` names the launchers' image.

Compile:  python -m torchx.pipelines.kfp.compile \
examples/pipelines/kfp/reference_pipeline.py:reference_pipeline pipeline.yaml
Run here: python examples/pipelines/kfp/run_local.py --out ./out-kfp
In containers of torchx's image: python examples/pipelines/kfp/run_local.py --runner docker
Cluster settings (image, env, scheduler, RBAC): docs/deploying_kfp.md
"""

import os
from typing import Any, List

from kfp import dsl

from torchx.pipelines.kfp.components import (
    close_pipeline_run,
    start_pipeline_run,
    torchx_launcher,
)
from torchx.pipelines.kfp.resources import launcher_resources, set_task_resources

# what the compiling machine imports to know each stage's resources
LOCAL_COMPONENTS = "examples.components"


def components() -> str:
    """How the launcher's image finds the stage components (read when the pipeline is built)."""
    return os.environ.get("TORCHX_EXAMPLE_COMPONENTS", "").strip() or LOCAL_COMPONENTS


def launch_stage(stage: str, component_args: List[Any], **kwargs: Any) -> Any:
    """A ``torchx_launcher`` task running ``stage`` of the components, with its resources."""
    where = components()
    task = torchx_launcher(component=f"{where}:{stage}", component_args=component_args, **kwargs)
    if where != LOCAL_COMPONENTS:  # not found here under the image's name: use the local copy
        found = launcher_resources(f"{LOCAL_COMPONENTS}:{stage}", component_args)
        set_task_resources(task, found)
    task.set_caching_options(False)
    return task


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
        prep = launch_stage(
            "datapreproc",
            ["--output_path", data, "--limit", limit],
            scheduler=scheduler,
            parent_run_id=run.output,
            **identity,
        )
        train = launch_stage(
            "trainer",
            [
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
        launch_stage(
            "evaluate",
            [
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
