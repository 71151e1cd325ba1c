"""Stall detection on a real local Ray head: the job's driver, its watchdog, stops a job
that neither prints nor reports progress for its ``stall_timeout``, every later reader sees
it FAILED ``stalled: ...`` (the reason is a line of the job's log, which the head keeps),
its MLflow run (real sqlite store) ends FAILED with the reason as a tag, and a job that
keeps printing or reporting is never stopped. The reason comes from Ray alone, never from
the submitter's disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.polling import poll_until
from tests.schedulers.stalled_job import (
    DEADLINE,
    PRINTS,
    assert_every_reader_sees_it_stalled,
    wait_out_a_silent_tracked_job,
)
from torchx import specs
from torchx.runner import get_runner
from torchx.schedulers.ray_driver import last_progress, output_waiting

pytestmark = pytest.mark.ray

REPORTS = (
    "import time; from torchx.trackers import report_progress\n"
    "for i in range(1, 41):\n    report_progress(i, total=40); time.sleep(0.5)\n"
)


def test_a_silent_ray_job_is_stopped_by_its_driver_and_ends_failed_for_every_reader(
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


def test_the_last_progress_record_is_read_through_rays_actor_prefix() -> None:
    lines = [
        'torchx-progress {"step": 3}',
        '\x1b[36m(Replica pid=7)\x1b[0m torchx-progress {"step": 4}',
        "(Replica pid=7) r/0 tick",
    ]
    assert last_progress(lines) == '{"step": 4}'
    assert last_progress(["r/0 tick"]) is None


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
