"""Cancel a stage's job when its task instance ends for good while the job still runs.

Registered by ``TorchXListenerPlugin``, the provider's ``airflow.plugins`` entry point, so
DAGs need no wiring. (Two copies of torchx's metadata on ``sys.path``, e.g. a source tree's
``torchx.egg-info`` next to the installed package, make Airflow's task SDK 1.3.2 stop
loading entry-point plugins at the duplicate name, so OpenLineage's listener can go
missing in task processes; see docs/orphans.md.)

Why a listener: a task instance can end without the operator's ``on_kill`` running; the case
that matters is a worker lost (SIGKILL, OOM, node gone): the scheduler fails the try after
``[scheduler] task_instance_heartbeat_timeout`` and then calls ``on_task_instance_failed``
itself, in the scheduler process (``TaskInstance.handle_failure``, reached from
``process_executor_events``). A user's "mark failed / success" calls it in the api-server; a
task's own end calls it in the task process. The same hook runs in each, so each of those
processes needs torchx's settings (``TORCHX_HOME`` for local_cwd, the schedulers'
credentials).

Only ``failed`` (no retry left) cancels. A try that Airflow will retry (``up_for_retry``)
keeps its job: the retry re-attaches to it. ``success`` never cancels: a task that does not
wait (``wait_for_completion=False``, a ``TorchXSensor`` waits later) succeeds while its job
runs, on purpose; a user's "mark success" of a running or deferred task already reaches
the operator's or the trigger's ``on_kill``. (Airflow 3.3 has no listener hook for
``removed``: ``torchx reap`` covers that one.)
A try can also fail with no task listener called anywhere: the kernel's OOM killer takes
the task process alone and Airflow's supervisor reports it failed through the execution
API. So when a DAG run ends (``on_dag_run_failed`` / ``on_dag_run_success``, in the
scheduler), its failed task instances are reaped by the same rule.
The job is the one the task pushed as its ``app_handle`` XCom, and it is cancelled only if
the owner stored with it is this task instance (dag, run, task, map index; any try, as a
retry re-attaches to the job of an earlier one). One already finished is left alone, and
so is, with a warning, one whose stored owner cannot be read, is another task instance, or
says ``cancel: false`` (the operator's ``cancel_on_kill=False``: the listener runs where
the operator's settings are not): a cancel needs a fact, not a doubt.
Nothing here raises into Airflow: a failure is logged.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING, Any, List, Optional

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

if TYPE_CHECKING:  # torchx loads when a task fails, not with the plugin
    from torchx.pipelines.owner import Owner

logger = logging.getLogger(__name__)

FINAL = ("failed",)
DAG_RUN_REAP_BUDGET = 30.0  # seconds of the scheduler's loop an ended DAG run may take
HANDLE_XCOM = "app_handle"


def _state(ti: Any) -> str:
    state = getattr(ti, "state", None)
    return str(getattr(state, "value", state) or "").lower()


def _app_handle(ti: Any) -> Optional[str]:
    """The ``app_handle`` XCom of this try: through the task SDK in a task process, from
    the metadata database elsewhere (scheduler, api-server)."""
    map_index = getattr(ti, "map_index", -1)
    if type(ti).__module__.startswith("airflow.sdk"):
        from torchx.pipelines.airflow.operator import TorchXOperator

        if not isinstance(getattr(ti, "task", None), TorchXOperator):
            return None  # a task process knows its operator: no XCom call for other tasks
        value = ti.xcom_pull(task_ids=ti.task_id, key=HANDLE_XCOM, map_indexes=map_index)
        return str(value) if value else None
    from airflow.models.xcom import XComModel

    with _own_session() as session:
        query = XComModel.get_many(
            run_id=ti.run_id,
            key=HANDLE_XCOM,
            task_ids=ti.task_id,
            dag_ids=ti.dag_id,
            map_indexes=map_index,
        )
        row = session.scalars(query).first()
        value = XComModel.deserialize_value(row) if row is not None else None
    return str(value) if value else None


def _is_owner(owner: Owner, ti: Any) -> bool:
    """Whether ``owner`` is task instance ``ti``, in any try."""
    map_index = getattr(ti, "map_index", None)
    mine = (ti.dag_id, ti.run_id, ti.task_id, -1 if map_index is None else int(map_index))
    ids = owner.ids
    try:
        theirs = (ids.get("dag"), ids.get("run"), ids.get("task"), int(ids.get("map", -1)))
    except (TypeError, ValueError):  # a malformed map index is nobody's
        return False
    return owner.kind == "airflow" and theirs == mine


def reap_task_instance(ti: Any) -> Optional[str]:
    """Cancel the live job of ``ti`` if ``ti`` ended for good; the cancelled handle."""
    state = _state(ti)
    if state not in FINAL:
        return None
    handle = _app_handle(ti)
    if not handle:
        return None
    from torchx.pipelines import core
    from torchx.pipelines.owner import owner_of

    with core.runner_for() as runner:
        status = runner.status(handle)
        if status is None or status.is_terminal():
            return None
        app = runner.describe(handle)
        owner = owner_of(app.metadata if app is not None else None)
        if owner is None:
            logger.warning("torchx: %s kept: its owner cannot be read", handle)
            return None
        if not owner.cancel:
            logger.warning("torchx: %s outlives its task (cancel_on_kill=False)", handle)
            return None
        if not _is_owner(owner, ti):
            logger.warning(
                "torchx: %s kept: its owner is %s, not this task", handle, owner.describe()
            )
            return None
        logger.warning(
            "torchx: task %s.%s (run %s, map %s) ended %s while %s runs: cancelling it",
            ti.dag_id,
            ti.task_id,
            ti.run_id,
            getattr(ti, "map_index", -1),
            state,
            handle,
        )
        runner.cancel(handle)
    return handle


def _safely(ti: Any) -> None:
    try:
        reap_task_instance(ti)
    except Exception:  # a listener must never break the scheduler or the task
        logger.exception("torchx: could not cancel the job of %s", ti)


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    _safely(task_instance)


def _own_session() -> Any:
    """A read-only session of its own. The hooks run inside Airflow's scheduler loop and
    API requests: the thread's scoped session is theirs, mid-transaction (committing or
    closing it would end their work; the scheduler even forbids a commit there)."""
    from airflow import settings

    if settings.NonScopedSession is None:
        raise RuntimeError("Airflow's metadata database is not configured in this process")
    return settings.NonScopedSession()  # closed, never committed, by ``with``


def _failed_task_instances(dag_run: Any) -> List[Any]:
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import select

    query = select(TaskInstance).where(
        TaskInstance.dag_id == dag_run.dag_id,
        TaskInstance.run_id == dag_run.run_id,
        TaskInstance.state.in_(FINAL),
    )
    with _own_session() as session:
        tis = list(session.scalars(query))
        session.expunge_all()  # detached: only their loaded columns are read later
    return tis


def _reap_dag_run(dag_run: Any) -> None:
    """Reap the run's failed task instances (see the module docstring), within
    ``DAG_RUN_REAP_BUDGET`` s: this runs in the scheduler's loop, and ``torchx reap``
    covers what is left."""
    started = time.monotonic()
    try:
        tis = _failed_task_instances(dag_run)
    except Exception:  # a listener must never break the scheduler
        logger.exception("torchx: could not read the failed tasks of %s", dag_run)
        return
    for i, ti in enumerate(tis):
        if time.monotonic() - started > DAG_RUN_REAP_BUDGET:
            logger.warning(
                "torchx: %d failed tasks of %s left to `torchx reap`", len(tis) - i, dag_run
            )
            return
        _safely(ti)


@hookimpl
def on_dag_run_failed(dag_run: Any, msg: str) -> None:
    _reap_dag_run(dag_run)


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    _reap_dag_run(dag_run)  # a failed task under a trigger rule such as all_done


class TorchXListenerPlugin(AirflowPlugin):
    """Registers this module's listener in every Airflow process that loads plugins."""

    name = "torchx_listener"
    listeners = [sys.modules[__name__]]
