"""Cancel a stage's job when its task instance ends for good while the job still runs.

The listener only records: in whichever Airflow process calls it, it reads the failed task
instances' ``app_handle`` XComs, writes them to a file and starts a short-lived process
(``python -m torchx.pipelines.airflow.listener <file>``, detached, in its own session,
reaped by init) that makes each cancel decision and cancels, with the ``TorchXHook``
Connection's settings. So a call holds Airflow's loop for milliseconds (each call logs its
own duration: ``torchx listener: <hook> took S s``), never for a scheduler's API call.

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
task's own end calls it in the task process. The same hook runs in each, and the process it
starts reads torchx's settings from the ``torchx_default`` Connection (else from the
environment it inherits: ``TORCHX_HOME`` for local_cwd, the schedulers' credentials).

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
The job is the one the task pushed as its ``app_handle`` XCom, and it is cancelled (by
``torchx.pipelines.reap.cancel_if_owned``, the decision every torchx canceller shares) only
if the owner stored with it is this task instance (dag, run, task, map index; any try, as a
retry re-attaches to the job of an earlier one). One already finished is left alone, and
so is, with a warning, one whose stored owner cannot be read, is another task instance, or
says ``cancel: false`` (the operator's ``cancel_on_kill=False``: the listener runs where
the operator's settings are not): a cancel needs a fact, not a doubt.
Nothing here raises into Airflow: a failure is logged. A cancel the process it starts could
not make (it died, the scheduler was unreachable) is left to ``torchx reap``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

logger = logging.getLogger("torchx.pipelines.airflow.listener")  # its name as __main__ too

FINAL = ("failed",)
HANDLE_XCOM = "app_handle"


@dataclass(frozen=True)
class Reapable:
    """A failed task instance and the job it pushed: what the started process decides on."""

    handle: str
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    state: str

    def what(self) -> str:
        return f"task {self.dag_id}.{self.task_id} (run {self.run_id}, map {self.map_index})"

    def is_owner(self, owner: Any) -> bool:
        from torchx.pipelines.owner import is_airflow_task

        return is_airflow_task(owner, self.dag_id, self.run_id, self.task_id, self.map_index)


def _state(ti: Any) -> str:
    state = getattr(ti, "state", None)
    return str(getattr(state, "value", state) or "").lower()


def _map_index(ti: Any) -> int:
    map_index = getattr(ti, "map_index", -1)
    return -1 if map_index is None else int(map_index)


def _in_task_process(ti: Any) -> bool:
    return type(ti).__module__.startswith("airflow.sdk")


def _app_handle(ti: Any) -> Optional[str]:
    """The ``app_handle`` XCom of this try: through the task SDK in a task process, from
    the metadata database elsewhere (scheduler, api-server)."""
    if _in_task_process(ti):
        from torchx.pipelines.airflow.operator import TorchXOperator

        if not isinstance(getattr(ti, "task", None), TorchXOperator):
            return None  # a task process knows its operator: no XCom call for other tasks
        value = ti.xcom_pull(task_ids=ti.task_id, key=HANDLE_XCOM, map_indexes=_map_index(ti))
        return str(value) if value else None
    handles = _pushed_handles(ti.dag_id, ti.run_id, [ti.task_id])
    return handles.get((ti.task_id, _map_index(ti)))


def _pushed_handles(
    dag_id: str, run_id: str, task_ids: Optional[List[str]]
) -> Dict[Tuple[str, int], str]:
    """``{(task_id, map_index): app_handle}`` of a DAG run's tasks, in one query."""
    from airflow.models.xcom import XComModel

    query = XComModel.get_many(run_id=run_id, key=HANDLE_XCOM, task_ids=task_ids, dag_ids=dag_id)
    with _own_session() as session:
        rows = list(session.scalars(query))
        found = {(r.task_id, int(r.map_index)): XComModel.deserialize_value(r) for r in rows}
    return {k: str(v) for k, v in found.items() if v}


def record_task_instance(ti: Any) -> Optional[Reapable]:
    """What to reap for ``ti``: its job, if ``ti`` ended for good and pushed one."""
    state = _state(ti)
    if state not in FINAL:
        return None
    handle = _app_handle(ti)
    if not handle:
        return None
    return Reapable(handle, ti.dag_id, ti.run_id, ti.task_id, _map_index(ti), state)


def record_dag_run(dag_run: Any) -> List[Reapable]:
    """What to reap for an ended DAG run: the jobs of its failed task instances (two
    queries, whatever their number)."""
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import select

    query = select(TaskInstance.task_id, TaskInstance.map_index, TaskInstance.state).where(
        TaskInstance.dag_id == dag_run.dag_id,
        TaskInstance.run_id == dag_run.run_id,
        TaskInstance.state.in_(FINAL),
    )
    with _own_session() as session:
        failed = list(session.execute(query))
    if not failed:
        return []
    handles = _pushed_handles(dag_run.dag_id, dag_run.run_id, None)
    found = []
    for task_id, map_index, state in failed:
        handle = handles.get((task_id, int(map_index)))
        if handle:
            state = str(getattr(state, "value", state)).lower()
            found.append(
                Reapable(handle, dag_run.dag_id, dag_run.run_id, task_id, int(map_index), state)
            )
    return found


def start_reaper(found: List[Reapable], quiet: bool = False) -> None:
    """Write ``found`` to a file and start the process that cancels (see the module doc):
    through ``sh -c '... &'``, so the new process is nobody's child here and nothing in
    this process waits for it beyond ``sh``'s own exit. Its log goes where this process's
    goes, unless ``quiet`` (a task process: Airflow's supervisor would wait for the
    process to close the task's log pipes)."""
    fd, path = tempfile.mkstemp(prefix="torchx-reap-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump([asdict(r) for r in found], f)
    command = [sys.executable, "-m", "torchx.pipelines.airflow.listener", path]
    out = subprocess.DEVNULL if quiet else None
    subprocess.run(
        ["/bin/sh", "-c", '"$@" </dev/null &', "sh", *command],
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=out,
        start_new_session=True,
        check=True,
    )


def _timed(hook: str, record: Callable[[], List[Reapable]], quiet: bool = False) -> None:
    """Run ``record``, start the reaper for what it found, log how long Airflow's loop was
    held; never raise into Airflow."""
    started = time.monotonic()
    found: List[Reapable] = []
    try:
        found = record()
        if found:
            start_reaper(found, quiet)
    except Exception:  # a listener must never break the scheduler or the task
        logger.exception("torchx: the %s listener could not record its jobs to cancel", hook)
    logger.info(
        "torchx listener: %s took %.4f s (%d to reap)", hook, time.monotonic() - started, len(found)
    )


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    def record() -> List[Reapable]:
        found = record_task_instance(task_instance)
        return [found] if found is not None else []

    _timed("on_task_instance_failed", record, _in_task_process(task_instance))


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


# ---------------------------------------------------------------------------- the reaper


def reap_recorded(runner: Any, found: List[Reapable]) -> List[str]:
    """Cancel the jobs of ``found`` that the shared decision allows; their handles."""
    from torchx.pipelines.reap import cancel_if_owned

    cancelled = []
    for r in found:
        try:
            owned = cancel_if_owned(
                runner, r.handle, r.is_owner, r.what(), f"ended {r.state}", logger
            )
        except Exception:  # one job's failure stops no other's cancel; torchx reap retries
            logger.exception("torchx: could not cancel the job of %s", r.what())
            continue
        if owned:
            cancelled.append(r.handle)
    return cancelled


def _read_records(path: str) -> Iterator[Reapable]:
    with open(path) as f:
        docs = json.load(f)
    os.unlink(path)
    for doc in docs:
        yield Reapable(**doc)


def main(argv: List[str]) -> int:
    """``python -m torchx.pipelines.airflow.listener <records file>``: the started process."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logger.setLevel(logging.INFO)
    found = list(_read_records(argv[1]))
    from torchx.pipelines.airflow.hook import runner_for_connection

    with runner_for_connection() as runner:
        reap_recorded(runner, found)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
