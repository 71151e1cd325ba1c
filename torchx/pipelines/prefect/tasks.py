"""Prefect tasks that submit, wait on and cancel torchx apps.

A stage is keyed by its flow run and ``key=`` (else a digest of what it runs), and the
scheduler stores the key with the job: a retry on any worker re-attaches to the stage's
live or succeeded app. ``submit_stage`` and ``wait_stage`` are what the tasks do, shared
with ``TorchXJob``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Callable, Dict, List, Optional, Union

from prefect import Task, get_run_logger, task
from prefect.artifacts import (
    create_link_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import TerminationSignal
from prefect.futures import PrefectFuture
from prefect.logging.loggers import flow_run_logger
from prefect.runtime import flow_run as runtime_flow_run
from prefect.utilities.annotations import BaseAnnotation, unmapped
from prefect.utilities.callables import get_call_parameters
from prefect.utilities.collections import isiterable
from prefect.utilities.engine import resolve_inputs_sync

from torchx.pipelines import core
from torchx.pipelines.owner import current_prefect_owner
from torchx.pipelines.prefect import stages
from torchx.pipelines.secrets import MaskedLog, stage_secrets
from torchx.runner.api import get_runner
from torchx.runner.config import get_configured_trackers
from torchx.specs.api import AppDef, AppStatus
from torchx.specs.secrets import Masker

TorchXJobFailed = core.StageFailed  # the name Prefect users catch

# a wait cancels its app on these only: a cancelled or timed-out task or flow run, and the
# SIGTERM the worker sends a cancelled flow run's process (TerminationSignal)
CANCELLATIONS = core.CANCELLATIONS + (TerminationSignal,)


def _flow_run(flow: Any = None, flow_run: Any = None) -> tuple[str, str]:
    """The flow run's id and flow name: a flow hook's (Prefect passes both), else the current."""
    fid = flow_run.id if flow_run is not None else runtime_flow_run.get_id()
    name = flow.name if flow is not None else runtime_flow_run.get_flow_name()
    return str(fid or "no-flow-run"), str(name or "flow")


def _in_flow_run() -> bool:
    return bool(runtime_flow_run.get_id())


def pipeline_run_id(flow: Any = None, flow_run: Any = None) -> str:
    """The tracker run of the current flow run (opened on first use), or of a flow hook's."""
    fid, name = _flow_run(flow, flow_run)
    return f"prefect://{name}/{fid}"


def stage_name(component: Union[str, AppDef], key: Optional[str] = None) -> str:
    """A stage's readable name: ``key``, else the component's (``utils.echo`` -> ``echo``,
    ``path/file.py:train`` -> ``train``, an AppDef -> its name)."""
    if key:
        return key
    if isinstance(component, AppDef):
        return component.name
    return component.rsplit(":", 1)[-1].rsplit(".", 1)[-1] or component


def _task_run_name(verb: str) -> Callable[..., str]:
    """A ``task_run_name`` callable: ``<verb>-<stage>`` (``<stage>`` alone without a verb)."""

    def name(parameters: Dict[str, Any]) -> str:
        if "handle" in parameters:  # wait: the stage's key, else the app's name
            stage = parameters.get("key") or _app_name(parameters["handle"])
        else:
            stage = stage_name(parameters["component"], parameters.get("key"))
        return f"{verb}-{stage}" if verb else stage

    return name


def run_params(stage: str) -> Dict[str, object]:
    """The Prefect params of a stage's tracker run (flow, flow run, stage, parameters)."""
    params: Dict[str, object] = {"prefect.task": stage}
    if not _in_flow_run():
        return params
    fid, flow_name = _flow_run()
    params["prefect.flow"] = flow_name
    params["prefect.flow_run_id"] = fid
    params["prefect.flow_run"] = runtime_flow_run.get_name()
    for name, value in (runtime_flow_run.get_parameters() or {}).items():
        params[f"prefect.param.{name}"] = value
    return params


def submit_stage(
    component: Union[str, AppDef],
    component_args: Union[List[str], Dict[str, Any], None],
    scheduler: str,
    cfg: Optional[Dict[str, Any]],
    key: Optional[str],
    parent_run_id: Optional[str],
    logger: core.Log,
    stall_timeout: Optional[float] = None,
) -> str:
    """Submit a stage, or re-attach to this flow run's app of the same stage; its handle.
    Outside a flow run the stage has no key and no pipeline run."""
    name = stage_name(component, key)
    with get_runner() as runner:
        # a misspelled cfg key fails here, before the flow run records a stage the cancel
        # hook could not look up
        runner.scheduler_run_opts(scheduler).check_known(cfg or {}, scheduler)
        idempotency_key = None
        if _in_flow_run():  # keyed, and recorded for the flow run's cancel hook
            fid = _flow_run()[0]
            what = key or core.content_key(component, component_args, scheduler, cfg or {})
            idempotency_key = core.stage_key("prefect", fid, what)
            trackers = runner.trackers()
            stages.record_stage(fid, stages.here(scheduler, idempotency_key, trackers, cfg))
            if not parent_run_id:  # the flow run's tracker run, opened on first use
                parent_run_id = core.open_pipeline_run(
                    pipeline_run_id(), trackers, orchestrator="prefect"
                )
        handle = core.submit_or_attach(
            runner,
            component,
            component_args,
            scheduler,
            cfg,
            idempotency_key,
            parent_run_id=parent_run_id or None,
            reattach_succeeded=True,  # within one flow run, a succeeded stage is done
            run_name=name,
            run_params=run_params(name),
            owner=current_prefect_owner(),
            stall_timeout=stall_timeout,
        )
        verb = "re-attaching to" if runner.reattached(handle) else "submitted"
    logger.info("%s %s", verb, handle)
    return handle


def wait_stage(
    handle: str,
    poll_interval: float,
    get_logs: bool,
    key: Optional[str],
    logger: core.Log,
    progress_interval: Optional[float] = core.PROGRESS_INTERVAL,
) -> AppStatus:
    """Wait for the app and publish the stage's artifacts under ``key`` (default: the app's
    name); ``TorchXJobFailed`` unless it SUCCEEDED."""

    def emit(role: str, k: int, line: str) -> None:
        logger.info("%s/%d %s", role, k, line)

    artifact_key = key or _app_name(handle)
    with get_runner() as runner:
        logger = MaskedLog(logger, Masker(stage_secrets(runner, handle)))
        try:
            status = core.wait_or_cancel(
                runner,
                handle,
                poll_interval,
                emit if get_logs else None,
                CANCELLATIONS,
                logger,
                on_progress=ProgressArtifact(handle, artifact_key, logger),
                progress_interval=progress_interval,
            )
        except core.StageFailed as e:
            if e.status is not None:
                _artifacts(handle, e.status, artifact_key, runner)
            raise
        _artifacts(handle, status, artifact_key, runner)
    logger.info("%s SUCCEEDED", handle)
    return status


class ProgressArtifact:
    """The stage's progress artifact ``torchx-progress-<key>``, created at the first report
    with a total and updated at each changed one; every report is logged."""

    def __init__(self, handle: str, artifact_key: str, logger: core.Log) -> None:
        self.handle = handle
        self.key = f"torchx-progress-{_safe(artifact_key)}"
        self.logger = logger
        self.artifact_id: Any = None

    def __call__(self, report: Any) -> None:
        line = core.progress_line(report)
        self.logger.info("%s", line)
        if not report.total or not _in_run():
            return
        percent = max(0.0, min(100.0, 100.0 * report.step / report.total))
        description = f"{self.handle}: {line}"
        if self.artifact_id is None:
            self.artifact_id = _sync(create_progress_artifact)(
                percent, key=self.key, description=description
            )
        else:
            _sync(update_progress_artifact)(self.artifact_id, percent, description=description)


def _sync(dispatching: Callable[..., Any]) -> Callable[..., Any]:
    """The sync form of a Prefect artifact function: in a thread of an async flow
    (``TorchXJob``) Prefect would dispatch to the coroutine form, which nobody awaits."""
    return functools.partial(dispatching, _sync=True)


def _in_run() -> bool:
    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def _safe(artifact_key: str) -> str:
    """An artifact key part: lowercase letters, digits and dashes."""
    return "".join(c if c.isalnum() else "-" for c in artifact_key).lower().strip("-")[:60]


def _artifacts(handle: str, status: AppStatus, artifact_key: str, runner: Any) -> None:
    """Link (only to a real URL) and table artifacts under stable per-stage keys, so
    Prefect keeps their history; none outside a flow or task run."""
    if not _in_run():
        return
    safe = _safe(artifact_key)
    if status.ui_url:
        _sync(create_link_artifact)(
            status.ui_url, link_text=f"{handle} logs", key=f"torchx-logs-{safe}"
        )
    tracker_run = core.tracker_run_link(handle, runner.trackers())
    if tracker_run:
        _sync(create_link_artifact)(
            tracker_run, link_text=f"MLflow run of {handle}", key=f"torchx-mlflow-{safe}"
        )
    rows = [
        {"role": r.role, "replica": x.id, "state": str(x.state), "host": x.hostname}
        for r in status.roles
        for x in r.replicas
    ]
    if rows:
        _sync(create_table_artifact)(
            rows, key=f"torchx-replicas-{safe}", description=f"{handle}: {status.state}"
        )


def _app_name(handle: str) -> str:
    """The app's name part of its id (``echo-ab12cd`` -> ``echo``), stable across runs."""
    app_id = handle.rstrip("/").rsplit("/", 1)[-1]
    return app_id.rsplit("-", 1)[0] if "-" in app_id else app_id


class StageTask(Task[Any, Any]):
    """A torchx task whose ``.map`` names each item's stage after its map index (else the
    items' artifacts overwrite each other and equal items share an app)."""

    def map(self, *args: Any, **kwargs: Any) -> Any:
        """Prefect's ``Task.map``, with ``key`` replaced by one key per item (see
        ``item_keys``)."""
        options = {
            k: kwargs.pop(k) for k in ("return_state", "wait_for", "deferred") if k in kwargs
        }
        parameters = get_call_parameters(self.fn, args, kwargs, apply_defaults=False)
        parameters["key"] = item_keys(parameters)
        return super().map(**parameters, **options)

    def with_options(self, *args: Any, **kwargs: Any) -> Any:
        """Prefect's ``Task.with_options``, still a ``StageTask`` (Prefect's builds a plain
        ``Task``, whose ``.map`` would lose the per-item keys)."""
        changed = super().with_options(*args, **kwargs)
        changed.__class__ = StageTask  # same fields: a StageTask adds behaviour only
        return changed


def stage_task(**options: Any) -> Callable[[Callable[..., Any]], StageTask]:
    """``@task(**options)``, as a ``StageTask``."""
    return lambda fn: StageTask(fn=fn, **options)


def item_keys(parameters: Dict[str, Any]) -> Any:
    """The ``key`` of each item of a ``.map`` over ``parameters``: one key (or the stage's
    name) numbered per item (``train-0``, ...); a list of keys as given, none repeated."""

    def plain(value: Any) -> Any:
        while isinstance(value, BaseAnnotation):
            value = value.unwrap()
        return value

    resolved = resolve_inputs_sync(parameters, max_depth=0)  # what Prefect maps over
    mapped = {
        name: list(plain(value))
        for name, value in resolved.items()
        if not isinstance(value, unmapped) and isiterable(plain(value))
    }
    key = plain(resolved.get("key"))
    if "key" in mapped:
        repeated = sorted({k for k in mapped["key"] if mapped["key"].count(k) > 1}, key=str)
        if repeated:
            raise ValueError(
                f"key repeats {repeated} in a .map: each item needs its own key "
                "(or pass one key, key=unmapped(name), to number them name-0, name-1, ...)"
            )
        return parameters["key"]
    lengths = {len(values) for values in mapped.values()}
    if len(lengths) != 1:  # nothing to map over, or lengths that differ: Prefect says so
        return parameters.get("key")
    count = lengths.pop()

    def item(name: str, i: int) -> Any:
        return mapped[name][i] if name in mapped else plain(resolved.get(name))

    def name(i: int) -> str:
        if key:
            return str(key)
        if "handle" not in resolved:
            return stage_name(item("component", i))
        handle = item("handle", i)  # wait: the app's name, once its submit returned it
        if isinstance(handle, PrefectFuture):
            handle = handle.result(raise_on_failure=False)
        return _app_name(handle) if isinstance(handle, str) else "stage"

    return [f"{name(i)}-{i}" for i in range(count)]


# not cached: a retried flow run must ask the scheduler (the key skips a cancelled or
# failed app), never get back the handle its cancelled try returned
@stage_task(
    name="torchx-submit",
    task_run_name=_task_run_name("submit"),
    persist_result=False,
    cache_policy=NO_CACHE,
)
def submit(
    component: Union[str, AppDef],
    component_args: Union[List[str], Dict[str, Any], None] = None,
    scheduler: str = "local_cwd",
    cfg: Optional[Dict[str, Any]] = None,
    key: Optional[str] = None,
    parent_run_id: Optional[str] = None,
    stall_timeout: Optional[float] = None,
) -> str:
    """Submit a component (name or ``file.py:fn``) or an AppDef; returns the app handle.

    Args:
        component: component name (``dist.ddp``), ``path/file.py:function``, or an AppDef
        component_args: the component's arguments, as a list (``["--msg", "hi"]``) or a
            dict of its parameters (a variadic component's extras under ``"args"``:
            ``{"script": "train.py", "j": "1x2", "args": ["--epochs", "3"]}``)
        scheduler: torchx scheduler (``local_cwd``, ``slurm``, ``kubernetes``, ...)
        cfg: scheduler run options (see ``torchx runopts``)
        key: names this stage within the flow run (default: a digest of what it runs);
            a retry with the same key re-attaches to its app; also the task run's name
            (``submit-<key>``); in a ``.map`` numbered per item (``<key>-<i>``, default
            ``<component>-<i>``) unless a list of keys is given
        parent_run_id: tracker run to nest the job under (default: the flow run's)
        stall_timeout: seconds; the job fails ``stalled: ...`` (its whole gang cancelled)
            when it neither prints nor reports progress for that long (stored with the job)
    """
    logger = get_run_logger()
    return submit_stage(
        component, component_args, scheduler, cfg, key, parent_run_id, logger, stall_timeout
    )


@stage_task(name="torchx-wait", task_run_name=_task_run_name("wait"), persist_result=True)
def wait(
    handle: str,
    poll_interval: float = 1.0,
    get_logs: bool = True,
    key: Optional[str] = None,
    progress_interval: Optional[float] = core.PROGRESS_INTERVAL,
) -> Dict[str, Any]:
    """Wait for the app; raises ``TorchXJobFailed`` unless it SUCCEEDED.

    Args:
        handle: the app handle ``submit`` returned
        poll_interval: seconds between status checks where the scheduler cannot push
        get_logs: copy the replicas' log lines into the task's log
        key: the stage's name, as given to ``submit``: the artifact keys
            (``torchx-mlflow-<key>``, ``torchx-replicas-<key>``, ``torchx-logs-<key>``)
            and the task run's name (``wait-<key>``); default: the app's name
        progress_interval: seconds between reads of the job's progress report
            (``report_progress``): a changed one updates the progress artifact
            ``torchx-progress-<key>`` (percent = 100 * step / total) and is logged;
            None: no progress artifact

    Returns the final status as JSON. An interrupted wait cancels the app.
    """
    logger = get_run_logger()
    return wait_stage(handle, poll_interval, get_logs, key, logger, progress_interval).to_json()


@task(name="torchx-cancel", task_run_name=_task_run_name("cancel"))
def cancel(handle: str) -> None:
    """Cancel the app (a stage's ``wait`` then raises ``TorchXJobFailed``).

    Args:
        handle: the app handle ``submit`` returned
    """
    with get_runner() as runner:
        runner.cancel(handle)


@stage_task(name="torchx-run", task_run_name=_task_run_name(""), persist_result=True)
def run(
    component: Union[str, AppDef],
    component_args: Union[List[str], Dict[str, Any], None] = None,
    scheduler: str = "local_cwd",
    cfg: Optional[Dict[str, Any]] = None,
    key: Optional[str] = None,
    poll_interval: float = 1.0,
    get_logs: bool = True,
    parent_run_id: Optional[str] = None,
    progress_interval: Optional[float] = core.PROGRESS_INTERVAL,
    stall_timeout: Optional[float] = None,
) -> str:
    """Submit and wait in one task (named after the stage: ``key``, else the component);
    returns the handle of the app that succeeded. Arguments as for ``submit`` and ``wait``.
    """
    logger = get_run_logger()
    handle = submit_stage(
        component, component_args, scheduler, cfg, key, parent_run_id, logger, stall_timeout
    )
    name = stage_name(component, key)
    wait_stage(handle, poll_interval, get_logs, name, logger, progress_interval)
    return handle


def cancel_flow_run_apps(flow: Any = None, flow_run: Any = None, state: Any = None) -> None:
    """Flow hook (``on_cancellation=[...]``, ``on_crashed=[...]``): cancel the flow run's
    apps and end its tracker run KILLED.

    Args:
        flow: the flow (Prefect passes it; its name names the tracker run)
        flow_run: the flow run whose apps to cancel (default: the current one)
        state: the flow run's state (unused: any end by cancel or crash is KILLED)
    """
    records = stages.read_stages(_flow_run(flow, flow_run)[0])
    pipeline_run = pipeline_run_id(flow, flow_run)
    trackers = get_configured_trackers()
    stages.cancel_stages(records, pipeline_run, _hook_logger(flow_run), trackers)


def _hook_logger(flow_run: Any) -> core.Log:
    """The flow run's own log (what the UI shows), also from the worker's process."""
    if flow_run is not None:
        with contextlib.suppress(AttributeError, ValueError):  # not a FlowRun: log here
            return flow_run_logger(flow_run)
    return logging.getLogger(__name__)


def close_pipeline_run(flow: Any = None, flow_run: Any = None, state: Any = None) -> None:
    """Flow hook (``on_completion=[...]``, ``on_failure=[...]``): end the flow run's tracker
    run FINISHED or FAILED.

    Args:
        flow: the flow (Prefect passes it; its name names the tracker run)
        flow_run: the flow run that ended (default: the current one)
        state: its final state: completed ends the run FINISHED, anything else FAILED
    """
    succeeded = bool(state.is_completed()) if state is not None else True
    state_name = core.final_state(succeeded)
    core.close_pipeline_run(pipeline_run_id(flow, flow_run), get_configured_trackers(), state_name)
