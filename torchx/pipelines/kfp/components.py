"""KFP components of torchx (defined in this file: KFP reads their source).

``torchx_launcher`` runs any torchx component on any scheduler from a pipeline step;
``start_pipeline_run`` opens the tracker run that groups a pipeline run's stages.
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
) -> NamedTuple("Outputs", [("app_handle", str), ("tracker_run_id", str)]):  # type: ignore[valid-type]  # noqa: B006
    """Submit a torchx component (``dist.ddp``, ``file.py:fn``) and wait for it; \
fails with the worker's error."""
    import dataclasses
    from collections import namedtuple

    from torchx.pipelines.kfp.launch import launch

    tc = (
        dataclasses.asdict(task_config)  # type: ignore[arg-type]
        if dataclasses.is_dataclass(task_config)
        else dict(task_config or {})
    )
    handle, run_id = launch(component, component_args, scheduler, dict(cfg), parent_run_id, tc)
    return namedtuple("Outputs", ["app_handle", "tracker_run_id"])(handle, run_id)  # type: ignore[call-arg]


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def start_pipeline_run(pipeline_name: str, job_id: str) -> str:
    """Open the tracker run of this pipeline run (stages are nested under it); returns its id."""
    import uuid

    from torchx.runner.config import get_configured_trackers
    from torchx.trackers.api import start_pipeline_run as start

    run_id = (
        f"kfp://{pipeline_name}/{job_id if job_id and '{{' not in job_id else uuid.uuid4().hex}"
    )
    trackers = get_configured_trackers()
    if trackers:
        start(run_id, trackers, orchestrator="kfp", pipeline=pipeline_name)
    return run_id
