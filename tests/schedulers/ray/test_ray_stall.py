"""Stall detection by the waiter on a real local Ray head: ``Runner.wait`` stops a job that
neither prints nor reports progress for its ``stall_timeout``, every later reader sees it
FAILED ``stalled: ...`` (the reason lives beside the job's request, which the head reads),
its MLflow run (real sqlite store) ends FAILED with the reason as a tag, and a job that
keeps printing or reporting is never stopped. Activity and the reason come from Ray alone
(the job's log, a marker job), never from the submitter's disk."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from tests.polling import poll_until
from tests.processes import wait_for_job_processes
from tests.schedulers.stalled_job import (
    DEADLINE,
    PRINTS,
    STALLS,
    assert_every_reader_sees_it_stalled,
    wait_out_a_silent_tracked_job,
)
from torchx import specs
from torchx.runner import get_runner
from torchx.schedulers import ray_activity
from torchx.schedulers.ray_activity import HEARTBEAT, Activity, due
from torchx.schedulers.ray_driver import output_waiting

pytestmark = pytest.mark.ray

REPORTS = (
    "import time; from torchx.trackers import report_progress\n"
    "for i in range(1, 41):\n    report_progress(i, total=40); time.sleep(0.5)\n"
)


def test_a_silent_ray_job_is_stopped_by_wait_and_ends_failed_stalled_for_every_reader(
    env: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handle, status, store = wait_out_a_silent_tracked_job("ray", tmp_path, monkeypatch)
    reason = "stalled: no progress or output for 10 s (last step 1)"
    assert status.msg == reason
    assert_every_reader_sees_it_stalled(handle, reason, store)


def test_ray_jobs_that_keep_printing_or_reporting_are_never_stopped(
    env: Path,  # noqa: F811
) -> None:
    with get_runner(trackers={}) as runner:
        handles = [
            runner.run_component("utils.python", ["--c", code], "ray", stall_timeout=5)
            for code in (PRINTS, REPORTS)
        ]
        for handle in handles:  # each outlives its timeout 4 times over
            status = runner.wait(handle, wait_interval=1, timeout=DEADLINE)
            assert status is not None and status.state == specs.AppState.SUCCEEDED, status
        report = runner.progress(handles[1])
        assert report is not None and report.step == 40 and report.total == 40


def test_a_stall_stop_that_fails_leaves_no_reason_behind_on_ray(
    env: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``stop_job`` fails (the dashboard refuses: Ray's client raises RuntimeError): the job
    runs on, and its later cancel by the user reads CANCELLED, not FAILED "stalled"."""
    from ray.job_submission import JobSubmissionClient

    def refuse(self: object, job_id: str) -> bool:
        raise RuntimeError(f"Request failed with status code 503: cannot stop {job_id}")

    with get_runner(trackers={}) as runner:
        handle = runner.run_component("utils.python", ["--c", STALLS], "ray", stall_timeout=5)
        app_id = specs.parse_app_handle(handle).app_id
        try:
            wait_for_job_processes(handle, 1, timeout=120)
            with monkeypatch.context() as patched:
                patched.setattr(JobSubmissionClient, "stop_job", refuse)
                status = runner.wait(handle, wait_interval=1, timeout=15)  # 3 stall timeouts
            assert status is not None and status.state == specs.AppState.RUNNING, status
            client = JobSubmissionClient(os.environ["RAY_API_SERVER_ADDRESS"])
            markers = {j.submission_id for j in client.list_jobs()}
            tried = {m for m in markers if m.startswith(f"{app_id}-stalled-")}
            assert tried and {m for m in tried if not m.endswith("-void")} == {
                m[: -len("-void")] for m in tried if m.endswith("-void")
            }  # every attempt's reason taken back
        finally:
            runner.cancel(handle)
        # polled, not waited on: a waiter would now stop the (still stalled) job itself
        status = poll_until(
            lambda: runner.status(handle), lambda s: s is None or s.is_terminal(), DEADLINE
        )
        assert status is not None and status.state == specs.AppState.CANCELLED, status


@pytest.mark.parametrize("published_ago", [0.0, 8.0, 20.0])
def test_only_the_silence_the_driver_saw_counts(published_ago: float) -> None:
    """Replicas silent for 1 s when the driver last asked read 1 s silent however late
    that record is read (a driver slow to publish on a loaded node, seen as a false stall in
    CI)."""
    now = time.time()
    record = Activity(silence=1.0, checked=now - published_ago, running=1)
    last = ray_activity.last_activity(ray_activity.last_record([record.line()]), now)
    assert last == pytest.approx(now - 1.0)


def test_a_stale_ended_or_missing_record_cannot_tell_and_later_output_is_activity() -> None:
    now = time.time()

    def last(*lines: str) -> Optional[float]:
        return ray_activity.last_activity(ray_activity.last_record(list(lines)), now)

    assert last("r/0 hi") is None  # no record yet
    stale = Activity(silence=100, checked=now - ray_activity.STALE_AFTER - 1, running=1)
    assert last(stale.line()) is None  # the driver stopped printing records
    assert last(Activity(silence=100, checked=now, running=0).line()) is None  # ending
    silent = Activity(silence=100, checked=now, running=1)
    # Ray's actor prefix, and lines that are not a replica's, change nothing
    assert last(f"(Replica pid=7) {silent.line()}", "torchx: x") == pytest.approx(now - 100)
    assert last(silent.line(), "(Replica pid=7) r/1 tick") == now  # printed since


def test_records_come_when_something_changed_or_the_silence_grew_by_a_tenth() -> None:
    first = Activity(silence=0.0, checked=1000.0, running=2)
    assert due(first, None)
    busy = Activity(silence=0.2, checked=1001.0, running=2)
    assert not due(busy, first)  # printing replicas: their lines say it
    assert due(Activity(0.2, 1001.0, 2, '{"step": 1}'), first)  # a new report
    assert due(Activity(0.2, 1001.0, 1), first)  # a replica ended
    assert due(Activity(0.2, 1000.0 + HEARTBEAT, 2), first)  # the heartbeat
    assert due(Activity(1.5, 1001.0, 2), first)  # silent: every round at first
    long = Activity(silence=300.0, checked=2000.0, running=2)
    assert not due(Activity(320.0, 2020.0, 2), long)  # then every tenth of the silence
    assert due(Activity(335.0, 2035.0, 2), long)
    assert (
        ray_activity.last_progress(
            [Activity(1, 1, 1, '{"step": 3}').line(), Activity(1, 2, 1).line(), "r/0 x"]
        )
        == '{"step": 3}'
    )


def test_output_the_actor_has_not_read_yet_counts_as_activity() -> None:
    """A replica's line still in the pipe (the actor's reading thread not scheduled yet, on
    a loaded node) is activity: the actor is asked about output that was written, not read."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "print('tick', flush=True); import time; time.sleep(60)"],
        stdout=subprocess.PIPE,
    )
    try:
        assert poll_until(lambda: output_waiting(proc.stdout), bool, timeout=60)
        assert proc.stdout is not None and proc.stdout.readline() == b"tick\n"
        assert not output_waiting(proc.stdout)  # read: the next line is the news
    finally:
        proc.kill()
        proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()
    assert not output_waiting(proc.stdout) and not output_waiting(None)
