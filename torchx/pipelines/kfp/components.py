"""KFP components of torchx (defined in this file: KFP reads their source).

``torchx_launcher`` runs any torchx component on any scheduler from a pipeline step;
``start_pipeline_run`` opens the tracker run that groups a pipeline run's stages and
``close_pipeline_run`` (an exit handler) ends it.
The image must have torchx installed (``base_image``, default ``torchx.IMAGE``); run
locally with ``kfp.local.SubprocessRunner(use_venv=False)`` they use this environment.
"""

from typing import List, NamedTuple

from torchx import IMAGE
from torchx.util.modules import import_optional

dsl = import_optional("kfp.dsl", "kfp")

_PASSTHROUGH = [
    dsl.TaskConfigPassthrough(field=dsl.TaskConfigField.RESOURCES, apply_to_task=False),
    dsl.TaskConfigPassthrough(field=dsl.TaskConfigField.ENV, apply_to_task=False),
    dsl.TaskConfigPassthrough(
        field=dsl.TaskConfigField.KUBERNETES_NODE_SELECTOR, apply_to_task=False
    ),
    dsl.TaskConfigPassthrough(
        field=dsl.TaskConfigField.KUBERNETES_TOLERATIONS, apply_to_task=False
    ),
    dsl.TaskConfigPassthrough(field=dsl.TaskConfigField.KUBERNETES_VOLUMES, apply_to_task=False),
]


@dsl.component(base_image=IMAGE, install_kfp_package=False, task_config_passthroughs=_PASSTHROUGH)
def torchx_launcher(
    component: str,
    component_args: List[str],
    task_config: dsl.TaskConfig,  # type: ignore[name-defined]
    scheduler: str = "local_cwd",
    cfg: dict = {},  # noqa: B006 (KFP needs a literal default)
    parent_run_id: str = "",
    job_id: str = "",
    task_name: str = "",
) -> NamedTuple("Outputs", [("app_handle", str), ("tracker_run_id", str)]):  # type: ignore[valid-type]  # noqa: B006
    """Run a torchx component (``dist.ddp``, ``file.py:fn``) on any scheduler and wait for it.

    Args:
        component: component name or ``path/file.py:function`` (in the launcher's image)
        component_args: the component's arguments, as on the command line
        task_config: KFP's task config: the resources, env, node selector and tolerations
            set on this task go to the launched app, not to the launcher
        scheduler: torchx scheduler (``kubernetes``, ``slurm``, ``local_cwd``, ...)
        cfg: scheduler run options (see ``torchx runopts``)
        parent_run_id: tracker run to nest the job under (``start_pipeline_run``'s output)
        job_id: the pipeline job id (pass ``dsl.PIPELINE_JOB_ID_PLACEHOLDER``)
        task_name: this task's name (pass ``dsl.PIPELINE_TASK_NAME_PLACEHOLDER``); with
            ``job_id`` it keys the submission, so a retried step re-attaches to its app

    Returns the app handle and the job's tracker run id. Fails with the worker's error;
    a terminated step (SIGTERM) cancels its app.
    """
    import dataclasses
    from collections import namedtuple

    from torchx.pipelines.kfp.launch import launch, launcher_key

    tc = (
        dataclasses.asdict(task_config)  # type: ignore[arg-type]
        if dataclasses.is_dataclass(task_config)
        else dict(task_config or {})
    )
    handle, run_id = launch(
        component,
        component_args,
        scheduler,
        dict(cfg),
        parent_run_id,
        tc,
        idempotency_key=launcher_key(job_id, task_name),
    )
    return namedtuple("Outputs", ["app_handle", "tracker_run_id"])(handle, run_id)  # type: ignore[call-arg]


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def start_pipeline_run(pipeline_name: str, job_id: str) -> str:
    """Open the tracker run of this pipeline run (stages are nested under it); returns its id."""
    import uuid

    from torchx.pipelines.kfp.launch import pipeline_run_id
    from torchx.runner.config import get_configured_trackers
    from torchx.trackers.api import start_pipeline_run as start

    run_id = pipeline_run_id(pipeline_name, job_id) or f"kfp://{pipeline_name}/{uuid.uuid4().hex}"
    trackers = get_configured_trackers()
    if trackers:
        start(run_id, trackers, orchestrator="kfp", pipeline=pipeline_name)
    return run_id


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def close_pipeline_run(
    pipeline_name: str,
    job_id: str,
    status: dsl.PipelineTaskFinalStatus,  # type: ignore[name-defined]
) -> str:
    """Exit handler: end the pipeline's tracker run FINISHED, FAILED or KILLED.

    Use it as ``with dsl.ExitHandler(close_pipeline_run(pipeline_name=..., job_id=
    dsl.PIPELINE_JOB_ID_PLACEHOLDER)):`` around the stages (same arguments as
    ``start_pipeline_run``); KFP fills ``status`` with the pipeline's final state.
    Returns the state the run ended in.
    """
    from torchx.pipelines import core
    from torchx.pipelines.kfp.launch import pipeline_run_id
    from torchx.runner.config import get_configured_trackers

    state = str(getattr(status, "state", "") or "").upper()
    end = core.final_state(state == "SUCCEEDED", cancelled=state in ("CANCELLED", "CANCELED"))
    run_id = pipeline_run_id(pipeline_name, job_id)
    if run_id:
        core.close_pipeline_run(run_id, get_configured_trackers(), end)
    return end
