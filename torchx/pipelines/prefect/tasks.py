"""Prefect tasks that submit, wait on and cancel torchx apps.

- ``submit`` is idempotent per flow run and ``key``: a retried submit whose app is still
  running or already succeeded returns that app instead of launching another.
- ``wait`` streams the job's log lines into ``get_run_logger()`` (``role/replica``
  prefixed), publishes a link artifact (logs / UI) and a table artifact (replica
  states), and raises ``TorchXJobFailed`` carrying the worker's error. If the wait is
  interrupted (flow cancelled, timeout), it cancels the app first.
- ``cancel_flow_run_apps`` is an ``on_cancellation`` / ``on_crashed`` flow hook that
  cancels every app the flow run submitted (tasks and ``TorchXJob`` blocks).
- Every app of a flow run is nested under the tracker run ``prefect://<flow>/<id>``.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Union

from prefect import get_run_logger, task
from prefect.artifacts import create_link_artifact, create_table_artifact

from torchx.pipelines.attach import AttachRecord
from torchx.specs.api import AppDef, AppState, AppStatus
from torchx.util.paths import torchx_home


class TorchXJobFailed(Exception):
    """A torchx app did not succeed; ``status`` has the replicas and the worker's error."""

    def __init__(self, handle: str, status: Optional[AppStatus]) -> None:
        summary = status.error_summary() if status else "app not found"
        super().__init__(f"torchx app {handle} {summary}")
        self.handle = handle
        self.status = status


def _runner() -> Any:
    from torchx.runner import get_runner

    return get_runner()


def _flow_run() -> tuple[str, str]:
    from prefect.runtime import flow_run

    return str(flow_run.get_id() or "no-flow-run"), str(flow_run.get_flow_name() or "flow")


def pipeline_run_id() -> str:
    """The tracker run of the current flow run (opened on first use)."""
    fid, name = _flow_run()
    return f"prefect://{name}/{fid}"


def _flow_apps_file(flow_run_id: str) -> Any:
    return torchx_home() / "prefect" / f"flow-{flow_run_id}.apps"


def record_flow_run_app(handle: str) -> None:
    """Note ``handle`` as an app of the current flow run, for ``cancel_flow_run_apps``."""
    from prefect.runtime import flow_run

    fid = flow_run.get_id()
    if not fid:  # not inside a flow run: there is nothing that could cancel it
        return
    path = _flow_apps_file(str(fid))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(handle + "\n")


def _open_pipeline_run() -> str:
    from torchx.runner.config import get_configured_trackers

    run_id = pipeline_run_id()
    trackers = get_configured_trackers()
    if trackers:
        from torchx.trackers.api import start_pipeline_run

        start_pipeline_run(run_id, trackers, orchestrator="prefect")
    return run_id


@task(name="torchx-submit")
def submit(
    component: Union[str, AppDef],
    component_args: Union[List[str], Dict[str, Any], None] = None,
    scheduler: str = "local_cwd",
    cfg: Optional[Dict[str, Any]] = None,
    key: Optional[str] = None,
    parent_run_id: Optional[str] = None,
) -> str:
    """Submit a component (name or ``file.py:fn``) or an AppDef; returns the app handle."""
    logger = get_run_logger()
    fid, _ = _flow_run()
    name = component.name if isinstance(component, AppDef) else component
    record = AttachRecord("prefect", f"{fid}/{key or name}")
    with _runner() as runner:
        handle = record.reusable(runner)
        if handle is not None:
            logger.info("re-attaching to %s submitted by an earlier try", handle)
            return handle
        parent = parent_run_id or _open_pipeline_run()
        if isinstance(component, AppDef):
            handle = runner.run(component, scheduler, cfg or {}, parent_run_id=parent)
        else:
            handle = runner.run_component(
                component, component_args or [], scheduler, cfg or {}, parent_run_id=parent
            )
    record.save(handle)
    record_flow_run_app(handle)
    logger.info("submitted %s", handle)
    return handle


def _stream(runner: Any, handle: str, logger: Any) -> None:
    from torchx.runner.logs import tail_app_logs

    for error in tail_app_logs(
        runner, handle, lambda role, k, line: logger.info("%s/%d %s", role, k, line)
    ):
        logger.warning("could not read logs of %s: %s", handle, error)


def _artifacts(handle: str, status: AppStatus) -> None:
    safe = "".join(c if c.isalnum() else "-" for c in handle.split("/")[-1]).lower()
    if status.ui_url:
        create_link_artifact(status.ui_url, link_text=f"{handle} logs", key=f"torchx-logs-{safe}")
    rows = [
        {"role": r.role, "replica": x.id, "state": str(x.state), "host": x.hostname}
        for r in status.roles
        for x in r.replicas
    ]
    if rows:
        create_table_artifact(
            rows, key=f"torchx-replicas-{safe}", description=f"{handle}: {status.state}"
        )
    try:
        from torchx.runner.config import get_configured_trackers
        from torchx.trackers.api import build_trackers

        for tracker in build_trackers(get_configured_trackers()):
            rid = getattr(tracker, "mlflow_run_id", lambda _: None)(handle)
            if rid:
                uri = getattr(tracker, "tracking_uri", "")
                link = (
                    f"{uri}/#/experiments/0/runs/{rid}"
                    if str(uri).startswith("http")
                    else f"mlflow-run:{rid} ({uri})"
                )
                create_link_artifact(
                    link, link_text=f"MLflow run of {handle}", key=f"torchx-mlflow-{safe}"
                )
    except Exception as e:  # artifacts are best effort; never fail the task for them
        get_run_logger().warning("could not link the MLflow run: %s", e)


@task(name="torchx-wait")
def wait(handle: str, poll_interval: float = 1.0, get_logs: bool = True) -> Dict[str, Any]:
    """Wait for the app; raises ``TorchXJobFailed`` unless it SUCCEEDED. \
Returns the status as JSON."""
    logger = get_run_logger()
    with _runner() as runner:
        try:
            if get_logs:
                _stream(runner, handle, logger)
            status = runner.wait(handle, wait_interval=poll_interval)
        except BaseException:
            logger.warning("wait interrupted: cancelling %s", handle)
            runner.cancel(handle)
            raise
    if status is None:
        raise TorchXJobFailed(handle, None)
    _artifacts(handle, status)
    if status.state != AppState.SUCCEEDED:
        raise TorchXJobFailed(handle, status)
    logger.info("%s SUCCEEDED", handle)
    return status.to_json()


@task(name="torchx-cancel")
def cancel(handle: str) -> None:
    with _runner() as runner:
        runner.cancel(handle)


@task(name="torchx-run")
def run(
    component: Union[str, AppDef],
    component_args: Union[List[str], Dict[str, Any], None] = None,
    scheduler: str = "local_cwd",
    cfg: Optional[Dict[str, Any]] = None,
    key: Optional[str] = None,
    poll_interval: float = 1.0,
) -> str:
    """Submit and wait (one task); returns the handle of the app that succeeded."""
    handle = submit.fn(component, component_args, scheduler, cfg, key)
    wait.fn(handle, poll_interval)
    return handle


def cancel_flow_run_apps(flow: Any = None, flow_run: Any = None, state: Any = None) -> None:
    """Flow hook (``on_cancellation=[...]``, ``on_crashed=[...]``): cancel the flow run's apps."""
    fid = str(getattr(flow_run, "id", None) or _flow_run()[0])
    path = _flow_apps_file(fid)
    if not path.exists():
        return
    with _runner() as runner:
        for handle in dict.fromkeys(path.read_text().split()):
            status = runner.status(handle)
            if status is not None and not status.is_terminal():
                runner.cancel(handle)


def status_json(handle: str) -> str:
    with _runner() as runner:
        status = runner.status(handle)
    return json.dumps(status.to_json() if status else None)
