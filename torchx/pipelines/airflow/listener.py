"""Cancel a stage's job when its task instance ends ``failed`` while the job still runs
(a lost worker, a user's "mark failed", a DAG run that ends with failed tasks); the rules
and why each holds are in docs/orphans.md.

The listener only records: it reads the failed task instances' ``app_handle`` XComs (one
query) and hands them to a short-lived process (``torchx.pipelines.airflow.reaper``) that
makes each cancel decision, so a call holds Airflow's loop for milliseconds and logs how
long (``torchx listener: <hook> took S s, ...``). Nothing here raises into Airflow.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Callable, List, Optional

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

from torchx.pipelines.airflow.reaper import Reapable, start
from torchx.pipelines.owner import map_index_of

logger = logging.getLogger(__name__)

FINAL = ("failed",)
HANDLE_XCOM = "app_handle"


def _in_task_process(ti: Any) -> bool:
    return type(ti).__module__.startswith("airflow.sdk")


def _operator(ti: Any) -> Any:
    """The ``TorchXOperator`` a task process runs (None for any other task)."""
    from torchx.pipelines.airflow.operator import TorchXOperator

    return ti.task if isinstance(ti.task, TorchXOperator) else None


def _app_handle(ti: Any) -> Optional[str]:
    """The ``app_handle`` XCom of this try: through the task SDK in a task process, from
    the metadata database elsewhere (scheduler, api-server)."""
    if _in_task_process(ti):
        operator = _operator(ti)
        if operator is None:
            return None  # a task process knows its operator: no XCom call for other tasks
        if operator.app_handle:  # this try submitted or re-attached: no XCom call either
            return str(operator.app_handle)
        value = ti.xcom_pull(task_ids=ti.task_id, key=HANDLE_XCOM, map_indexes=map_index_of(ti))
        return str(value) if value else None
    from airflow.models.xcom import XComModel

    query = XComModel.get_many(
        run_id=ti.run_id,
        key=HANDLE_XCOM,
        task_ids=ti.task_id,
        dag_ids=ti.dag_id,
        map_indexes=map_index_of(ti),
    )
    with _own_session() as session:
        row = session.scalars(query).first()
        value = XComModel.deserialize_value(row) if row is not None else None
    return str(value) if value else None


def record_task_instance(ti: Any) -> List[Reapable]:
    """What to reap for ``ti``: its job, if ``ti`` ended for good and pushed one."""
    state = str(ti.state or "").lower()  # TaskInstanceState: a str enum, str() its value
    if state not in FINAL:
        return []
    handle = _app_handle(ti)
    if not handle:
        return []
    return [Reapable(handle, ti.dag_id, ti.run_id, ti.task_id, map_index_of(ti), state)]


def record_dag_run(dag_run: Any) -> List[Reapable]:
    """What to reap for an ended DAG run: the jobs of its failed task instances (one
    query, whatever their number)."""
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.xcom import XComModel as X
    from sqlalchemy import and_, select

    pushed = and_(
        X.dag_id == TI.dag_id,
        X.run_id == TI.run_id,
        X.task_id == TI.task_id,
        X.map_index == TI.map_index,
        X.key == HANDLE_XCOM,
    )
    query = (
        select(TI.task_id, TI.map_index, TI.state, X.value)
        .join(X, pushed)
        .where(TI.dag_id == dag_run.dag_id, TI.run_id == dag_run.run_id, TI.state.in_(FINAL))
    )
    with _own_session() as session:
        rows = list(session.execute(query))
    found = []
    for row in rows:
        handle = X.deserialize_value(row)
        if handle:
            state = str(row.state).lower()
            ids = (dag_run.dag_id, dag_run.run_id, row.task_id, int(row.map_index))
            found.append(Reapable(str(handle), *ids, state))
    return found


def _timed(hook: str, record: Callable[[], List[Reapable]], task: Any = None) -> None:
    """Run ``record``, start the reaper for what it found, log how long the calling loop
    was held (``task``: the operator, when called in its task process); never raise into
    Airflow."""
    started, cpu = time.monotonic(), time.thread_time()
    found: List[Reapable] = []
    try:
        found = record()
        if found:
            start(found, task.hook.settings if task is not None else None)
    except Exception:  # a listener must never break the scheduler or the task
        logger.exception("torchx: the %s listener could not record its jobs to cancel", hook)
    # ``airflow scheduler`` (or api-server, ...): what the duration line names
    process = " ".join(os.path.basename(a) for a in sys.argv[:2]) or "this process"
    where = "in its task process" if task is not None else f"in {process}"
    took, cpu = time.monotonic() - started, time.thread_time() - cpu
    logger.info(
        "torchx listener: %s took %.4f s, %.4f s of CPU (%d to reap) %s",
        hook,
        took,
        cpu,
        len(found),
        where,
    )


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    task = _operator(task_instance) if _in_task_process(task_instance) else None
    _timed("on_task_instance_failed", lambda: record_task_instance(task_instance), task)


def _own_session() -> Any:
    """A read-only session of its own. The hooks run inside Airflow's scheduler loop and
    API requests: the thread's scoped session is theirs, mid-transaction (committing or
    closing it would end their work; the scheduler even forbids a commit there)."""
    from airflow import settings

    if settings.NonScopedSession is None:
        raise RuntimeError("Airflow's metadata database is not configured in this process")
    return settings.NonScopedSession()  # closed, never committed, by ``with``


@hookimpl
def on_dag_run_failed(dag_run: Any, msg: str) -> None:
    _timed("on_dag_run_failed", lambda: record_dag_run(dag_run))


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    # a failed task under a trigger rule such as all_done
    _timed("on_dag_run_success", lambda: record_dag_run(dag_run))


class TorchXListenerPlugin(AirflowPlugin):
    """Registers this module's listener in every Airflow process that loads plugins."""

    name = "torchx_listener"
    listeners = [sys.modules[__name__]]
