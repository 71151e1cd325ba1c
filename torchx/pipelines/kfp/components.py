"""KFP components of torchx (defined in this file: KFP reads their source).

``torchx_launcher`` runs any torchx component on any scheduler from a pipeline step;
``start_pipeline_run`` and ``close_pipeline_run`` (an exit handler) open and end the
pipeline's tracker run. Their image must have torchx installed (``image.base_image``).
"""

from typing import TYPE_CHECKING, Any, Callable, List, NamedTuple

from torchx.pipelines.kfp.image import base_image
from torchx.util.modules import import_optional

if TYPE_CHECKING:  # read as Any (pyproject: kfp builds these types at run time)
    from kfp import dsl
    from kfp.dsl import python_component as _python_component
else:  # one clear line when kfp is not installed
    dsl = import_optional("kfp.dsl", "kfp")
    _python_component = import_optional("kfp.dsl.python_component", "kfp")

# the app gets the task's resources, node selector, tolerations and volumes instead of the
# launcher's pod; env set on the task (task.set_env_variable) reaches both: the launcher
# needs the tracking URI, credentials and scheduler settings as much as the app does
_PASSTHROUGH = [
    dsl.TaskConfigPassthrough(field=field, apply_to_task=field == dsl.TaskConfigField.ENV)
    for field in (
        dsl.TaskConfigField.RESOURCES,
        dsl.TaskConfigField.ENV,
        dsl.TaskConfigField.KUBERNETES_NODE_SELECTOR,
        dsl.TaskConfigField.KUBERNETES_TOLERATIONS,
        dsl.TaskConfigField.KUBERNETES_VOLUMES,
    )
]


class TorchXComponent(_python_component.PythonComponent):
    """A KFP Python component of torchx: documented by its function's docstring (``help``
    shows ours, not KFP's class text); a task made inside a pipeline runs in
    ``base_image()`` and, for the launcher, carries the launched app's resources."""

    def __init__(self, component_spec: Any, python_func: Callable[..., Any]) -> None:
        super().__init__(component_spec=component_spec, python_func=python_func)
        self.__doc__ = python_func.__doc__
        self.__name__ = python_func.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from kfp.dsl import pipeline_context

        task = super().__call__(*args, **kwargs)
        if pipeline_context.Pipeline.get_default_pipeline() is None:
            return task  # executed at once (kfp.local): nothing to build
        image = base_image()
        if task.container_spec is not None and task.container_spec.image != image:
            task.set_container_image(image)
        if self.python_func.__name__ == "torchx_launcher":
            from torchx.pipelines.kfp.resources import launcher_resources, set_task_resources

            _check_keyed_in_loop(kwargs)

            found = launcher_resources(kwargs.get("component"), kwargs.get("component_args"))
            set_task_resources(task, found)
        return task


def _check_keyed_in_loop(kwargs: Any) -> None:
    """A keyed launcher in a ``dsl.ParallelFor`` needs ``key``: every iteration has the same
    task name, so without it every iteration would re-attach to the first one's app."""
    from kfp.dsl import pipeline_context, tasks_group

    pipeline = pipeline_context.Pipeline.get_default_pipeline()
    in_loop = any(isinstance(g, tasks_group.ParallelFor) for g in pipeline.groups)
    if in_loop and kwargs.get("task_name") and not kwargs.get("key"):
        raise ValueError(
            "torchx_launcher in a dsl.ParallelFor with task_name needs key= (the loop item, "
            "or a field of it): every iteration has the same task name, and would share "
            "the first iteration's app"
        )


def _torchx_component(**options: Any) -> Callable[[Callable[..., Any]], TorchXComponent]:
    """``@dsl.component`` in the base image, without installing kfp, as a TorchXComponent."""

    def wrap(fn: Callable[..., Any]) -> TorchXComponent:
        import docstring_parser

        made = dsl.component(fn, base_image=base_image(), install_kfp_package=False, **options)
        # KFP documents output artifacts (``Output[...]`` parameters) only from "Returns:"
        args = {p.arg_name: p.description for p in docstring_parser.parse(fn.__doc__).params}
        for name, spec in (made.component_spec.outputs or {}).items():
            if spec.description is None and args.get(name):
                spec.description = args[name]
        return TorchXComponent(made.component_spec, made.python_func)

    return wrap


@_torchx_component(task_config_passthroughs=_PASSTHROUGH)
def torchx_launcher(
    component: str,
    component_args: List[str],
    task_config: dsl.TaskConfig,
    metrics: dsl.Output[dsl.Metrics],
    model: dsl.Output[dsl.Model],
    dataset: dsl.Output[dsl.Dataset],
    scheduler: str = "local_cwd",
    cfg: dict = {},  # noqa: B006 (KFP needs a literal default)
    parent_run_id: str = "",
    job_id: str = "",
    task_name: str = "",
    stall_timeout: float = 0.0,
    key: str = "",
) -> NamedTuple(  # type: ignore[valid-type]
    "Outputs", [("app_handle", str), ("tracker_run_id", str), ("tracker_run_url", str)]
):
    """Run a torchx component (``dist.ddp``, ``file.py:fn``) on any scheduler and wait for it.

    The step submits the app through the torchx Runner (a distributed or elastic job runs on
    the scheduler, not in this pod), streams its logs as ``role/replica`` lines, fails with
    the worker's error, cancels the app when the step is terminated, and re-attaches to its
    app when KFP retries the step. The app's resources (one replica's cpu, memMB, gpu from
    ``component_args``) are set on this task when the pipeline is built, so the IR shows
    them. With a tracker configured the app's run is named after this task and records the
    pipeline job, the task and these inputs as params.

    Args:
        component: component name (``dist.ddp``, ``utils.sh``), ``package.module:function``
            or ``path/file.py:function``, as the launcher's image sees it
        component_args: the component's arguments, as on the ``torchx run`` command line
            (``["-j", "2x4", "--script", "train.py", "--", "--lr", "0.1"]``)
        task_config: filled by KFP (do not pass): the resources, node selector,
            tolerations and volumes set on this task go to the launched app, not to the
            launcher's pod; env set on this task (``task.set_env_variable``) goes to both
            the launcher's own container and the app
        metrics: the last value of every metric rank 0 logged, and the last progress report
            (``report_progress``): ``step``, ``total`` and its metrics, and the app's
            requested ``cpu_hours`` / ``gpu_hours`` (filled after the app ends)
        model: the model the stage recorded (``record_output(path, "model", {"type":
            "model"})``): its URI is where the stage wrote it, its metadata links the
            tracker run; ``recorded`` is false when the stage recorded none
        dataset: the dataset the stage recorded (``{"type": "dataset"}``), as ``model``
        scheduler: torchx scheduler that runs the app (``kubernetes``, ``slurm``,
            ``aws_batch``, ``ray``, ``local_cwd``)
        cfg: the scheduler's run options (``torchx runopts SCHEDULER`` lists them)
        parent_run_id: the pipeline's tracker run to nest the app's run under
            (``start_pipeline_run``'s output); empty: not nested
        job_id: the pipeline job id (pass ``dsl.PIPELINE_JOB_ID_PLACEHOLDER``)
        task_name: this task's name (pass ``dsl.PIPELINE_TASK_NAME_PLACEHOLDER``); with
            ``job_id`` it keys the submission, so a retried step re-attaches to its app,
            and it names the app's tracker run
        stall_timeout: seconds; the app fails ``stalled: ...`` (its whole gang cancelled)
            when it neither prints nor reports progress for that long; 0: never
        key: names this stage among those of the same task: in a ``dsl.ParallelFor``,
            where every iteration has the same task name, pass the loop item (or a
            field of it) so each iteration keys its own app; the app's tracker run is
            then named ``<task_name>[<key>]``

    Returns:
        app_handle: the app's handle (``scheduler://session/app_id``)
        tracker_run_id: the app's tracker run id (the MLflow run id with the ``mlflow``
            tracker); empty without a tracker
        tracker_run_url: the tracker run's page in the tracker's UI; empty without a UI
    """
    import dataclasses
    from collections import namedtuple

    from torchx.pipelines.kfp.launch import launch, launcher_key
    from torchx.pipelines.kfp.outputs import fill_outputs

    tc = (
        dataclasses.asdict(task_config)  # type: ignore[arg-type]
        if dataclasses.is_dataclass(task_config)
        else dict(task_config or {})
    )
    stage = f"{task_name}[{key}]" if key and task_name else task_name or key
    handle, record = launch(
        component,
        component_args,
        scheduler,
        dict(cfg),
        parent_run_id,
        tc,
        idempotency_key=launcher_key(job_id, stage),
        job_id=job_id,
        task_name=stage,
        stall_timeout=stall_timeout or None,
    )
    fill_outputs(record, handle, metrics, model, dataset)
    fields = ["app_handle", "tracker_run_id", "tracker_run_url"]
    return namedtuple("Outputs", fields)(handle, record.run_id, record.run_url)  # type: ignore[call-arg,name-match]


@_torchx_component()
def start_pipeline_run(pipeline_name: str, job_id: str) -> str:
    """Open the tracker run of this pipeline run (stages are nested under it); returns its id."""
    import uuid

    from torchx.pipelines import core
    from torchx.pipelines.kfp.launch import pipeline_run_id
    from torchx.runner.config import get_configured_trackers

    run_id = pipeline_run_id(pipeline_name, job_id) or f"kfp://{pipeline_name}/{uuid.uuid4().hex}"
    trackers = get_configured_trackers()
    return core.open_pipeline_run(run_id, trackers, orchestrator="kfp", pipeline=pipeline_name)


@_torchx_component()
def close_pipeline_run(
    pipeline_name: str,
    job_id: str,
    status: dsl.PipelineTaskFinalStatus,
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
