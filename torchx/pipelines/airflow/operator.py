"""``TorchXOperator``: submit a torchx component or AppDef from an Airflow task.

- ``execute`` submits through the Runner, streams the job's log lines into the task log
  (``role/replica`` prefixed), returns the app handle (XCom ``return_value``, also pushed
  as ``app_handle`` right after submission) and pushes the final status (``app_status``);
  a failed app raises with the worker's exception message.
- ``deferrable=True`` hands the wait to ``TorchXTrigger``, freeing the worker slot.
- ``on_kill`` (task marked failed, DAG run stopped) cancels the app; a deferred task is
  cancelled by the trigger's cleanup (Airflow does not call ``on_kill`` for it).
- Retries re-attach on any worker: the submission's idempotency key (dag, task, run, map
  index) is stored by the scheduler with the job, and on Airflow >= 3.3 the handle is also
  kept in the task state store. A cleared task whose app SUCCEEDED runs again, unless
  ``reuse_succeeded=True``; a FAILED or CANCELLED app is never re-attached.
- Lineage: every job of a DAG run is nested under one tracker run
  ``airflow://<dag_id>/<run_id>``; give the DAG ``on_success_callback`` and
  ``on_failure_callback`` = ``close_pipeline_run`` so that run ends FINISHED or FAILED.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from airflow.sdk import BaseOperator, BaseOperatorLink

from torchx.pipelines import core
from torchx.specs.api import AppDef, AppStatus

try:  # Airflow 3
    from airflow.exceptions import AirflowException
except ImportError:  # pragma: no cover
    AirflowException = RuntimeError  # type: ignore[misc, assignment]

STATE_STORE_KEY = "torchx_app_handle"


def _default_deferrable() -> bool:
    try:
        from airflow.configuration import conf

        return conf.getboolean("operators", "default_deferrable", fallback=False)
    except Exception:
        return False


class _XComLink(BaseOperatorLink):
    """An extra link whose URL the task pushed to XCom (no link when none was pushed)."""

    name = ""

    def get_link(self, operator: BaseOperator, *, ti_key: Any) -> str:
        try:
            from airflow.sdk.execution_time.xcom import XCom

            return XCom.get_value(ti_key=ti_key, key=self.xcom_key) or ""
        except Exception:
            return ""


class TorchXAppLink(_XComLink):
    """Extra link: where the app's logs / UI are (the scheduler's ``ui_url``)."""

    name = "TorchX app"


class TorchXMLflowLink(_XComLink):
    """Extra link: the app's MLflow run in the MLflow UI (when there is a UI)."""

    name = "MLflow run"


def pipeline_run_id(dag_id: str, run_id: str) -> str:
    """The tracker run that groups every torchx job of one DAG run."""
    return f"airflow://{dag_id}/{run_id}"


def close_pipeline_run(
    context: Mapping[str, Any], trackers: Optional[Mapping[str, Optional[str]]] = None
) -> None:
    """DAG ``on_success_callback`` / ``on_failure_callback``: end the DAG run's tracker run
    FINISHED (DAG run succeeded) or FAILED. ``trackers`` default to the configured ones;
    bind them with ``functools.partial`` when the operators are given ``trackers=``."""
    from torchx.runner.config import get_configured_trackers

    dag_run = context["dag_run"]
    state = str(getattr(dag_run, "state", "") or "")
    succeeded = state.endswith("success")
    core.close_pipeline_run(
        pipeline_run_id(dag_run.dag_id, dag_run.run_id),
        get_configured_trackers() if trackers is None else trackers,
        core.final_state(succeeded),
    )


class TorchXOperator(BaseOperator):
    """Run a torchx component (``utils.sh``, ``dist.ddp``, ``path/file.py:fn``) or an AppDef.

    :param component: component name or ``path/file.py:function`` (or give ``app``).
    :param app: an ``AppDef`` to run instead of a component.
    :param component_args: the component's arguments, as on the command line
        (``["--msg", "hi"]``) or as a dict of its parameters (``{"msg": "hi"}``); a
        variadic component's extra args go under ``"args"`` (``{"args": ["echo", "hi"]}``
        for ``utils.sh``). Templated.
    :param scheduler: torchx scheduler (``local_cwd``, ``slurm``, ``kubernetes``, ...). Templated.
    :param cfg: scheduler run options (see ``torchx runopts``). Templated.
    :param wait_for_completion: wait for the app to end (else return the handle at once).
    :param deferrable: wait in the triggerer (``TorchXTrigger``), freeing the worker slot.
    :param poll_interval: seconds between status checks where the scheduler cannot push.
    :param get_logs: copy the replicas' log lines into the task log.
    :param cancel_on_kill: cancel the app when the task is killed or marked failed.
    :param trackers: ``{tracker: config}`` for this task's job (default: the configured ones;
        ``{}`` turns tracking off).
    :param parent_run_id: tracker run to nest the job under (default: the DAG run's).
    :param reattach: re-attach a retry to the app its earlier try submitted.
    :param reuse_succeeded: with ``reattach``, a cleared task whose app already SUCCEEDED
        returns that app instead of running again.
    """

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
        reuse_succeeded: bool = False,
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
        self.reuse_succeeded = reuse_succeeded
        self.app_handle: Optional[str] = None

    # ------------------------------------------------------------------ helpers

    def _runner(self) -> Any:
        return core.runner_for(self.trackers)

    def _idempotency_key(self, context: Mapping[str, Any]) -> Optional[str]:
        if not self.reattach:
            return None
        ti = context["ti"]
        map_index = getattr(ti, "map_index", -1)
        return core.stage_key("airflow", ti.dag_id, ti.task_id, ti.run_id, map_index)

    def _cached_handle(self, context: Mapping[str, Any], runner: Any) -> Optional[str]:
        """The handle an earlier try kept in Airflow's task state store, if still reusable."""
        store = context.get("task_state_store")
        if store is None or not self.reattach:
            return None
        try:
            handle = store.get(STATE_STORE_KEY)
        except Exception:
            return None
        if not handle:
            return None
        status = runner.status(handle)
        if status is None:
            return None
        if not status.is_terminal() or (self.reuse_succeeded and status.state.name == "SUCCEEDED"):
            return str(handle)
        return None

    def _submit(self, context: Mapping[str, Any], runner: Any) -> str:
        ti = context["ti"]
        handle = self._cached_handle(context, runner)
        if handle is not None:
            self.log.info("re-attaching to %s (task state store)", handle)
            return handle
        parent = self.parent_run_id or core.open_pipeline_run(
            pipeline_run_id(ti.dag_id, ti.run_id),
            runner.trackers(),
            orchestrator="airflow",
            dag_id=ti.dag_id,
        )
        submission = core.submit_or_attach(
            runner,
            self.app if self.app is not None else str(self.component),
            self.component_args,
            self.scheduler,
            self.cfg,
            self._idempotency_key(context),
            parent_run_id=parent,
            reattach_succeeded=self.reuse_succeeded,
        )
        verb = "re-attaching to" if submission.reattached else "submitted"
        self.log.info("%s %s", verb, submission.handle)
        store = context.get("task_state_store")
        if store is not None:
            try:
                store.set(STATE_STORE_KEY, submission.handle)
            except Exception as e:  # a cache only: the scheduler holds the key
                self.log.warning(
                    "could not keep %s in the task state store: %s", submission.handle, e
                )
        return submission.handle

    # ------------------------------------------------------------------ execute

    def execute(self, context: Any) -> str:
        ti = context["ti"]
        runner = self._runner()
        handle = self._submit(context, runner)
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
        emit = self._emit if self.get_logs else None
        try:
            status = core.wait_or_cancel(runner, handle, self.poll_interval, emit)
        except core.StageFailed as e:
            self._finish(ti, handle, e.status, runner)
            raise AirflowException(str(e)) from None
        return self._finish(ti, handle, status, runner)

    def execute_complete(self, context: Any, event: Optional[Dict[str, Any]] = None) -> str:
        """Resume after the trigger fired: check the event, copy the logs, raise on failure."""
        if not event or "app_handle" not in event or "state" not in event:
            raise AirflowException(f"invalid event from TorchXTrigger: {event!r}")
        handle = event["app_handle"]
        self.app_handle = handle
        runner = self._runner()
        if self.get_logs:
            core.follow_logs(runner, handle, self._emit, tail=False)
        status = runner.status(handle)
        self._finish(context["ti"], handle, status, runner)
        try:
            core.check_succeeded(handle, status)
        except core.StageFailed as e:
            raise AirflowException(str(e)) from None
        return handle

    def _emit(self, role: str, replica: int, line: str) -> None:
        self.log.info("%s/%d %s", role, replica, line)

    def _finish(self, ti: Any, handle: str, status: Optional[AppStatus], runner: Any) -> str:
        """Push the final status and the tracker link (links only where there is a UI)."""
        if status is not None:
            ti.xcom_push(key="app_status", value=status.to_json())
        link = core.tracker_run_link(handle, runner.trackers())
        if link:
            ti.xcom_push(key=TorchXMLflowLink().xcom_key, value=link)
        if status is not None and status.state.name == "SUCCEEDED":
            self.log.info("%s SUCCEEDED", handle)
        return handle

    def on_kill(self) -> None:
        if self.cancel_on_kill and self.app_handle:
            self.log.info("task killed: cancelling %s", self.app_handle)
            core.cancel_quietly(self._runner(), self.app_handle)
