"""Stall detection on the real local Slurm cluster: the watchdog that runs each replica
(``torchx.runtime.watchdog``) ends a job whose replicas neither print nor report progress
for its ``stall_timeout``; every later reader sees it FAILED ``stalled: ...`` (the reason
is the last line of the replica's ``.err``),
its MLflow run (real sqlite store) ends FAILED with the reason as a tag, no process of it
is left, and a job that keeps printing is never stopped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.polling import poll, poll_until
from tests.processes import job_processes, wait_for_job_processes
from tests.schedulers.stalled_job import (
    DEADLINE,
    PRINTS,
    STALLS,
    assert_every_reader_sees_it_stalled,
    wait_out_a_silent_tracked_job,
)
from tests.schedulers.test_slurm_scheduler import cluster, env  # noqa: F401 (fixtures)
from torchx import specs
from torchx.runner import get_runner
from torchx.schedulers.slurm.scheduler import create_scheduler

pytestmark = pytest.mark.slurm
WATCHED = 2  # a replica's processes: its command and the watchdog that runs it


def test_a_silent_slurm_job_is_stopped_by_its_watchdog_and_ends_failed_for_every_reader(
    env: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handle, status, store = wait_out_a_silent_tracked_job("slurm", tmp_path, monkeypatch, WATCHED)
    assert status.msg.startswith("stalled: no progress or output for 10 s ("), status.msg
    assert_every_reader_sees_it_stalled(handle, status.msg, store)


def test_a_slurm_job_that_keeps_printing_is_never_stopped(env: Path) -> None:  # noqa: F811
    with get_runner(trackers={}) as runner:
        handle = runner.run_component("utils.python", ["--c", PRINTS], "slurm", stall_timeout=5)
        status = runner.wait(handle, wait_interval=1, timeout=DEADLINE)  # 4 timeouts long
        assert status is not None and status.state == specs.AppState.SUCCEEDED, status


def test_a_pipeline_stage_that_did_not_submit_sees_a_stalled_slurm_job_fail(
    env: Path,  # noqa: F811
) -> None:
    """The stages' wait (``core.wait_or_cancel``, as Airflow, Prefect and KFP run it) with a
    fresh Runner, as the Airflow trigger polls: the job's watchdog stopped it, the stage
    reads why."""
    from torchx.pipelines.core import StageFailed, wait_or_cancel

    with get_runner(trackers={}) as submitter:
        handle = submitter.run_component("utils.python", ["--c", STALLS], "slurm", stall_timeout=10)
    with get_runner(trackers={}) as stage:
        with pytest.raises(StageFailed, match="stalled: no progress or output for 10 s") as e:
            wait_or_cancel(stage, handle, poll_interval=1)
    assert e.value.status is not None and e.value.status.state == specs.AppState.FAILED
    left = poll_until(lambda: job_processes(handle), lambda procs: not procs, timeout=60)
    assert left == []


def test_a_suspended_slurm_job_is_not_judged_and_never_stopped(env: Path) -> None:  # noqa: F811
    """SUSPENDED reads RUNNING for torchx, but its replicas cannot print: the watchdog is
    suspended with them, and counts its own suspension as none of their silence."""
    import subprocess

    with get_runner(trackers={}) as runner:
        handle = runner.run_component("utils.python", ["--c", STALLS], "slurm", stall_timeout=5)
        job_id = specs.parse_app_handle(handle).app_id
        try:
            wait_for_job_processes(handle, WATCHED, timeout=120)
            subprocess.run(["scontrol", "suspend", job_id], check=True, timeout=60)
            status = runner.wait(handle, wait_interval=1, timeout=15)  # 3 stall timeouts
            assert status is not None and status.state == specs.AppState.RUNNING, status
            subprocess.run(["scontrol", "resume", job_id], check=True, timeout=60)
            # judged again from its resume: it stalls 5 s later, FAILED with the reason
            status = runner.wait(handle, wait_interval=1, timeout=DEADLINE)
            assert status is not None and status.state == specs.AppState.FAILED, status
            assert status.msg.startswith("stalled: no progress or output for 5 s"), status
        finally:
            subprocess.run(["scontrol", "resume", job_id], timeout=60)
            runner.cancel(handle)


def test_a_requeued_slurm_job_is_judged_from_its_new_start(env: Path) -> None:  # noqa: F811
    """A requeue starts the replicas, and their watchdogs, afresh: the new run is judged
    from its own start, not from its previous run's output."""
    import subprocess

    with get_runner(trackers={}) as runner:
        handle = runner.run_component("utils.python", ["--c", STALLS], "slurm", stall_timeout=60)
        job_id = specs.parse_app_handle(handle).app_id
        try:
            wait_for_job_processes(handle, WATCHED, timeout=120)
            poll(  # the first run wrote its progress file
                lambda: os.path.exists(create_scheduler("t").progress_path(job_id) or ""),
                DEADLINE,
                "the first run's progress report",
                every=0.2,
            )
            subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=60)

            def state() -> str:
                out = subprocess.run(
                    ["squeue", "-h", "-j", job_id, "-o", "%T %r"], capture_output=True, text=True
                )
                return out.stdout.strip()

            # Slurm delays a requeued job's start by two minutes (once it is PENDING on
            # BeginTime: an update before that is overridden): start it in 3 s instead (a
            # slurmd refuses to relaunch a job within the second it killed it)
            delayed = "PENDING BeginTime"
            assert poll_until(state, lambda s: s == delayed, timeout=60) == delayed
            subprocess.run(
                ["scontrol", "update", f"jobid={job_id}", "StartTime=now+3"], check=True, timeout=60
            )
            wait_for_job_processes(handle, WATCHED, timeout=120)
            status = runner.wait(handle, wait_interval=1, timeout=5)
            assert status is not None and status.state == specs.AppState.RUNNING, status
        finally:
            runner.cancel(handle)


def test_a_gang_is_judged_as_a_whole_and_its_reason_is_the_apps(
    env: Path,  # noqa: F811
) -> None:
    """Replica 1 is silent from the start while replica 0 prints for 10 s (twice the
    timeout) and then goes silent: replica 1 is not stopped while its peer prints (their
    logs share the job directory), then the gang stalls and reads FAILED with the reason,
    whichever replica's watchdog ended first."""
    code = (
        "import os, time\n"
        "if os.environ['TORCHX_REPLICA_ID'] == '0':\n"
        "    for i in range(20):\n        print('tick', i, flush=True); time.sleep(0.5)\n"
        "time.sleep(600)\n"
    )
    with get_runner(trackers={}) as runner:
        handle = runner.run_component(
            "utils.python", ["--num_replicas", "2", "--c", code], "slurm", stall_timeout=5
        )
        status = runner.wait(handle, wait_interval=1, timeout=DEADLINE)
        assert status is not None and status.state == specs.AppState.FAILED, status
        assert status.msg == "stalled: no progress or output for 5 s (no step reported)", status
        assert "tick 19" in "".join(runner.log_lines(handle, "python", 0))
    left = poll_until(lambda: job_processes(handle), lambda procs: not procs, timeout=60)
    assert left == []
