"""torchx's Airflow listener with real Airflow 3 (a ``dag.test`` run on sqlite, its
``app_handle`` XCom read from the metadata database as in the scheduler) and real
local_cwd jobs: a failed task instance cancels only a live job whose stored owner is that
task instance (in any try); an unreadable owner, another task instance's or one that
keeps its job (``cancel: false``) keeps the job, with a warning. The listener only records
(its hook returns at once); the process it starts makes the cancel."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from tests.pipelines.airflow.test_operator import _dag
from tests.polling import poll_until

DEADLINE = 60.0


def _owner(**ids: Any) -> str:
    import json

    return json.dumps({"kind": "airflow", **ids})


def _state(handle: str) -> str:
    from torchx.runner import get_runner

    with get_runner() as runner:
        status = runner.status(handle)
    return status.state.name if status is not None else ""


class _Warnings(logging.Handler):
    """The listener's warnings (Airflow's logging config leaves ``caplog`` nothing)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_the_listener_cancels_only_the_job_of_this_task_instance(
    torchx_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.models.xcom import XComModel

    from torchx.pipelines.airflow.listener import HANDLE_XCOM, record_task_instance
    from torchx.pipelines.airflow.reaper import logger, reap_recorded
    from torchx.runner import get_runner

    monkeypatch.setenv("TORCHX_TRACKERS", "")
    dag = _dag(
        "listener_owner",
        component="utils.sh",
        component_args=["sleep", "600"],
        wait_for_completion=False,  # the task succeeds, its job runs on
    )
    dag_run = dag.test()
    dag_id, run_id = dag_run.dag_id, dag_run.run_id
    ti = SimpleNamespace(
        state="failed", dag_id=dag_id, run_id=run_id, task_id="job", map_index=-1, try_number=2
    )

    def point_xcom_at(handle: str) -> None:
        XComModel.set(HANDLE_XCOM, handle, dag_id=dag_id, task_id="job", run_id=run_id)

    def reap_task_instance(ti: Any) -> Optional[str]:
        [found] = record_task_instance(ti)  # what the hook records, read from the database
        assert found.state == "failed"
        with get_runner() as runner:
            cancelled = reap_recorded(runner, [found])  # what the started process does
        return cancelled[0] if cancelled else None

    mine = {"dag": dag_id, "run": run_id, "task": "job", "map": -1, "try": 1}
    others: dict[str, Optional[str]] = {
        "no owner": None,
        "unparseable owner": "{not json",
        "another task": _owner(**{**mine, "task": "other"}),
        "another run": _owner(**{**mine, "run": "manual__other"}),
        "another dag": _owner(**{**mine, "dag": "other"}),
        "another map index": _owner(**{**mine, "map": 2}),
        "a malformed map index": _owner(**{**mine, "map": "x"}),
        "cancel: false": _owner(**mine, cancel=False),
    }
    with get_runner() as runner:
        real = next(a.app_handle for a in runner.list("local_cwd"))  # the task's own job
        handles = {
            why: runner.run_component("utils.sh", ["sleep", "600"], "local_cwd", owner=owner)
            for why, owner in others.items()
        }
        try:
            for why, handle in handles.items():
                point_xcom_at(handle)
                warnings = _Warnings()
                logger.addHandler(warnings)
                try:
                    assert reap_task_instance(ti) is None, why
                finally:
                    logger.removeHandler(warnings)
                assert _state(handle) == "RUNNING", why
                assert [w for w in warnings.lines if handle in w], (why, warnings.lines)
                assert not [w for w in warnings.lines if "cancelling" in w], why
            # the task's own job, pushed in try 1, is cancelled when a later try fails
            point_xcom_at(real)
            assert reap_task_instance(ti) == real
            state = poll_until(lambda: _state(real), lambda s: s == "CANCELLED", DEADLINE)
            assert state == "CANCELLED"
        finally:
            for handle in [real, *handles.values()]:
                runner.cancel(handle)


def test_the_hook_returns_at_once_and_the_process_it_starts_cancels(
    torchx_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``on_task_instance_failed`` (as the scheduler calls it, its XCom read from the
    database) starts the cancelling process and returns; that process, not the hook,
    cancels the job. A task instance still to be retried records nothing."""
    from torchx.pipelines.airflow import listener
    from torchx.runner import get_runner

    monkeypatch.setenv("TORCHX_TRACKERS", "")
    dag = _dag(
        "listener_detached",
        component="utils.sh",
        component_args=["sleep", "600"],
        wait_for_completion=False,
    )
    dag_run = dag.test()
    with get_runner() as runner:
        handle = next(a.app_handle for a in runner.list("local_cwd"))
    try:
        ti = SimpleNamespace(
            dag_id=dag_run.dag_id, run_id=dag_run.run_id, task_id="job", map_index=-1
        )
        started: list[list[Any]] = []
        real_start = listener.start
        monkeypatch.setattr(listener, "start", lambda f, settings=None: started.append(f))
        listener.on_task_instance_failed(
            None, SimpleNamespace(**vars(ti), state="up_for_retry"), None
        )
        assert started == []  # a retry re-attaches: nothing to reap
        listener.on_task_instance_failed(None, SimpleNamespace(**vars(ti), state="failed"), None)
        assert [r.handle for r in started[0]] == [handle]
        assert _state(handle) == "RUNNING"  # the hook itself cancels nothing
        real_start(started[0])
        state = poll_until(lambda: _state(handle), lambda s: s == "CANCELLED", DEADLINE)
        assert state == "CANCELLED"
    finally:
        with get_runner() as runner:
            runner.cancel(handle)


def test_the_process_a_task_process_starts_needs_no_airflow_database(
    torchx_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a task process the listener hands its operator's settings to the process it
    starts, whose environment (a worker's) cannot configure Airflow's database: it cancels
    without importing Airflow."""
    from torchx.pipelines.airflow.reaper import Reapable, start
    from torchx.pipelines.owner import Owner
    from torchx.pipelines.settings import TorchXSettings
    from torchx.runner import get_runner

    monkeypatch.setenv("TORCHX_TRACKERS", "")
    owner = Owner("airflow", {"dag": "d", "run": "r", "task": "t", "map": 3, "try": 1})
    home = torchx_env / "given_home"  # the settings' own, not the environment's
    with get_runner(torchx_home=str(home)) as runner:
        handle = runner.run_component(
            "utils.sh", ["sleep", "600"], "local_cwd", owner=owner.to_metadata()
        )
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "not-a-database-url")
    try:
        start([Reapable(handle, "d", "r", "t", 3, "failed")], TorchXSettings(str(home)))

        def state() -> str:
            with get_runner(torchx_home=str(home)) as runner:
                status = runner.status(handle)
            return status.state.name if status is not None else ""

        assert poll_until(state, lambda s: s == "CANCELLED", DEADLINE) == "CANCELLED"
    finally:
        with get_runner(torchx_home=str(home)) as runner:
            runner.cancel(handle)
