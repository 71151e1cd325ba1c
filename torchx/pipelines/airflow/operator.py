"""``TorchXOperator``: submit a torchx component or AppDef from an Airflow task.

- ``execute`` submits through the Runner, streams the job's log lines into the task log
  (``role/replica`` prefixed), returns the app handle (XCom ``return_value``, also pushed
  as ``app_handle`` right after submission) and pushes the final status (``app_status``);
  a failed app raises with the worker's exception message.
- ``deferrable=True`` hands the wait to ``TorchXTrigger``, freeing the worker slot.
- ``on_kill`` (task marked failed, DAG run stopped) cancels the app; a deferred task is
  cancelled by the trigger's cleanup (Airflow does not call ``on_kill`` for it).
- Retries re-attach: the handle of each (dag, task, run, map index) is recorded under
  ``$TORCHX_HOME/airflow``; a retried try whose app is still running or already
  succeeded waits on that app instead of submitting a second one.
- Lineage: every job of a DAG run is nested under one tracker run
  ``airflow://<dag_id>/<run_id>``; extra links point at the app's logs.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from airflow.sdk import BaseOperator, BaseOperatorLink

from torchx.pipelines.attach import AttachRecord
from torchx.specs.api import AppDef, AppState, AppStatus

try:  # Airflow 3
    from airflow.exceptions import AirflowException
except ImportError:  # pragma: no cover
    AirflowException = RuntimeError  # type: ignore[misc, assignment]


def _default_deferrable() -> bool:
    try:
        from airflow.configuration import conf

        return conf.getboolean("operators", "default_deferrable", fallback=False)
    except Exception:
        return False


class TorchXAppLink(BaseOperatorLink):
    """Extra link: where the app's logs / UI are (the scheduler's ``ui_url``)."""

    name = "TorchX app"

    def get_link(self, operator: BaseOperator, *, ti_key: Any) -> str:
        try:
            from airflow.sdk.execution_time.xcom import XCom

            return XCom.get_value(ti_key=ti_key, key=self.xcom_key) or ""
        except Exception:
            return ""


class TorchXMLflowLink(BaseOperatorLink):
    """Extra link: the MLflow run of the app (when an MLflow tracker is configured)."""

    name = "MLflow run"

    def get_link(self, operator: BaseOperator, *, ti_key: Any) -> str:
        try:
            from airflow.sdk.execution_time.xcom import XCom

            return XCom.get_value(ti_key=ti_key, key=self.xcom_key) or ""
        except Exception:
            return ""


def mlflow_run_link(handle: str, trackers: Mapping[str, Optional[str]]) -> Optional[str]:
    """URL (or ``mlflow-run:<id>`` for a local store) of the app's MLflow run, if tracked."""
    if "mlflow" not in trackers:
        return None
    from torchx.trackers.api import build_trackers

    tracker = build_trackers({"mlflow": trackers["mlflow"]})[0]
    rid = tracker.mlflow_run_id(handle)  # type: ignore[attr-defined]
    if not rid:
        return None
    uri = str(tracker.tracking_uri)  # type: ignore[attr-defined]
    if uri.startswith(("http://", "https://")):
        exp = tracker.client.get_run(rid).info.experiment_id  # type: ignore[attr-defined]
        return f"{uri.rstrip('/')}/#/experiments/{exp}/runs/{rid}"
    return f"mlflow-run:{rid} ({uri})"


def pipeline_run_id(dag_id: str, run_id: str) -> str:
    """The tracker run that groups every torchx job of one DAG run."""
    return f"airflow://{dag_id}/{run_id}"


class TorchXOperator(BaseOperator):
    """Run a torchx component (``utils.sh``, ``dist.ddp``, ``path/file.py:fn``) or an AppDef."""

    template_fields: Sequence[str] = (
        "component",
        "component_args",
        "scheduler",
        "cfg",
        "parent_run_id",
    )
    template_fields_renderers = {"component_args": "json", "cfg": "json"}
    operator_extra_links = (TorchXAppLink(), TorchXMLflowLink())
    ui_color = "#ee4c2c"

    def __init__(
        self,
        *,
        component: Optional[str] = None,
        app: Optional[AppDef] = None,
        component_args: Union[List[str], Dict[str, Any], None] = None,
        scheduler: str = "local_cwd",
        cfg: Optional[Dict[str, Any]] = None,
        wait_for_completion: bool = True,
        deferrable: Optional[bool] = None,
        poll_interval: float = 5.0,
        get_logs: bool = True,
        cancel_on_kill: bool = True,
        trackers: Optional[Dict[str, Optional[str]]] = None,
        parent_run_id: Optional[str] = None,
        reattach: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (component is None) == (app is None):
            raise ValueError(f"{self.task_id}: give exactly one of component= or app=")
        self.component = component
        self.app = app
        self.component_args = component_args if component_args is not None else []
        self.scheduler = scheduler
        self.cfg = cfg or {}
        self.wait_for_completion = wait_for_completion
        self.deferrable = _default_deferrable() if deferrable is None else deferrable
        self.poll_interval = poll_interval
        self.get_logs = get_logs
        self.cancel_on_kill = cancel_on_kill
        self.trackers = trackers
        self.parent_run_id = parent_run_id
        self.reattach = reattach
        self.app_handle: Optional[str] = None

    # ------------------------------------------------------------------ helpers

    def _runner(self) -> Any:
        from torchx.runner import get_runner

        return get_runner()

    def _tracker_config(self) -> Dict[str, Optional[str]]:
        if self.trackers is not None:
            return dict(self.trackers)
        from torchx.runner.config import get_configured_trackers

        return get_configured_trackers()

    def _attach_key(self, context: Mapping[str, Any]) -> str:
        ti = context["ti"]
        return "/".join(
            str(x) for x in (ti.dag_id, ti.task_id, ti.run_id, getattr(ti, "map_index", -1))
        )

    def _open_pipeline_run(self, context: Mapping[str, Any]) -> Optional[str]:
        if self.parent_run_id:
            return self.parent_run_id
        trackers = self._tracker_config()
        ti = context["ti"]
        run_id = pipeline_run_id(ti.dag_id, ti.run_id)
        if trackers:
            import torchx.trackers.api as tracker_api

            tracker_api.start_pipeline_run(
                run_id, trackers, orchestrator="airflow", dag_id=ti.dag_id
            )
        return run_id

    def _cfg(self) -> Dict[str, Any]:
        cfg = dict(self.cfg)
        if self.trackers is not None:
            # make the job see the operator's trackers (the Runner reads them from the env)
            from torchx.trackers.api import tracker_config_env_var_name

            os.environ["TORCHX_TRACKERS"] = ",".join(self.trackers)
            for name, config in self.trackers.items():
                if config:
                    os.environ[tracker_config_env_var_name(name)] = config
        return cfg

    # ------------------------------------------------------------------ execute

    def execute(self, context: Any) -> str:
        ti = context["ti"]
        runner = self._runner()
        record = AttachRecord("airflow", self._attach_key(context))
        handle = record.reusable(runner) if self.reattach else None
        if handle is not None:
            self.log.info("re-attaching to %s submitted by an earlier try", handle)
        if handle is None:
            parent = self._open_pipeline_run(context)
            cfg = self._cfg()
            if self.app is not None:
                handle = runner.run(self.app, self.scheduler, cfg, parent_run_id=parent)
            else:
                handle = runner.run_component(
                    self.component, self.component_args, self.scheduler, cfg, parent_run_id=parent
                )
            record.save(handle)
            self.log.info("submitted %s", handle)
        self.app_handle = handle
        ti.xcom_push(key="app_handle", value=handle)
        status = runner.status(handle)
        if status is not None and status.ui_url:
            ti.xcom_push(key=TorchXAppLink().xcom_key, value=status.ui_url)
        if not self.wait_for_completion:
            return handle
        if self.deferrable:
            from torchx.pipelines.airflow.trigger import TorchXTrigger

            self.defer(
                trigger=TorchXTrigger(
                    app_handle=handle,
                    poll_interval=self.poll_interval,
                    cancel_on_kill=self.cancel_on_kill,
                ),
                method_name="execute_complete",
            )
        if self.get_logs:
            self._stream_logs(runner, handle, tail=True)
        final = runner.wait(handle, wait_interval=self.poll_interval)
        return self._finish(ti, handle, final)

    def execute_complete(self, context: Any, event: Optional[Dict[str, Any]] = None) -> str:
        """Resume after the trigger fired: check the event, copy the logs, raise on failure."""
        if not event or "app_handle" not in event or "state" not in event:
            raise AirflowException(f"invalid event from TorchXTrigger: {event!r}")
        handle = event["app_handle"]
        self.app_handle = handle
        runner = self._runner()
        if self.get_logs:
            self._stream_logs(runner, handle, tail=False)
        return self._finish(context["ti"], handle, runner.status(handle))

    def _finish(self, ti: Any, handle: str, status: Optional[AppStatus]) -> str:
        if status is None:
            raise AirflowException(f"{handle} is not known to its scheduler any more")
        ti.xcom_push(key="app_status", value=status.to_json())
        try:
            link = mlflow_run_link(handle, self._tracker_config())
            if link:
                ti.xcom_push(key=TorchXMLflowLink().xcom_key, value=link)
        except Exception as e:  # a link is never worth failing the task
            self.log.warning("could not link the MLflow run of %s: %s", handle, e)
        if status.state != AppState.SUCCEEDED:
            raise AirflowException(f"torchx app {handle} {status.error_summary()}")
        self.log.info("%s SUCCEEDED", handle)
        return handle

    def _stream_logs(self, runner: Any, handle: str, tail: bool) -> None:
        from torchx.runner.logs import tail_app_logs

        for error in tail_app_logs(
            runner, handle, lambda role, k, line: self.log.info("%s/%d %s", role, k, line), tail
        ):
            self.log.warning("could not read logs of %s: %s", handle, error)

    def on_kill(self) -> None:
        if self.cancel_on_kill and self.app_handle:
            self.log.info("task killed: cancelling %s", self.app_handle)
            self._runner().cancel(self.app_handle)
