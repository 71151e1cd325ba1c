"""local_cwd stall detection and progress, with real processes: the supervisor stops an
app that neither prints nor reports progress for ``stall_timeout`` s (FAILED, with the
reason, no process left), never one that keeps printing or reporting; only rank 0's
reports of a torchrun gang count."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.processes import job_processes
from tests.schedulers.test_local_support import app, app_dir, home, role
from torchx import specs
from torchx.runner import get_runner

__all__ = ["home"]  # the fixture

pytestmark = pytest.mark.usefixtures("home")

DEADLINE = 90  # generous: the machine is shared; nothing here asserts a time


def python_role(code: str, name: str = "w") -> specs.Role:
    return specs.Role(name=name, image=".", entrypoint=sys.executable, args=["-c", code])


def test_a_stalled_app_fails_with_the_reason_and_leaves_no_process() -> None:
    code = (
        "from torchx.trackers import report_progress; import time\n"
        "report_progress(1, total=10); print('started', flush=True); time.sleep(300)"
    )
    with get_runner() as runner:
        h = runner.run(app(python_role(code)), "local_cwd", stall_timeout=2)
        request = json.loads((app_dir(h) / "request.json").read_text())
        assert request["stall_timeout"] == 2  # stored with the job, not in this process
        status = runner.wait(h, wait_interval=1, timeout=DEADLINE)
        assert status is not None and status.state == specs.AppState.FAILED, status
        assert status.msg == "stalled: no progress or output for 2 s (last step 1)"
        assert "stalled: no progress or output for 2 s" in status.error_summary()
        assert job_processes(h) == []  # recorded only once the whole gang is gone
        progress = runner.progress(h)
        assert progress is not None and (progress.step, progress.total) == (1, 10)


def test_an_app_that_reports_nothing_stalls_too() -> None:
    with get_runner() as runner:
        h = runner.run(app(role("sleep 300")), "local_cwd", stall_timeout=1)
        status = runner.wait(h, wait_interval=1, timeout=DEADLINE)
        assert status is not None and status.state == specs.AppState.FAILED, status
        assert status.msg == "stalled: no progress or output for 1 s (no step reported)"
        assert job_processes(h) == []
        assert runner.progress(h) is None


def test_apps_that_keep_printing_or_reporting_are_never_stopped() -> None:
    printing = role("for i in 1 2 3 4 5 6 7 8; do echo tick $i; sleep 1; done")
    reporting = python_role(
        "from torchx.trackers import report_progress; import time\n"
        "for i in range(1, 9):\n    report_progress(i, total=8); time.sleep(1)"
    )
    with get_runner() as runner:
        # the reporter gets 5 s: its first report comes after Python and torchx start
        handles = [
            runner.run(app(r), "local_cwd", stall_timeout=timeout)
            for r, timeout in ((printing, 3), (reporting, 5))
        ]
        for h in handles:
            status = runner.wait(h, wait_interval=1, timeout=DEADLINE)
            assert status is not None and status.state == specs.AppState.SUCCEEDED, status
        progress = runner.progress(handles[1])
        assert progress is not None and (progress.step, progress.total) == (8, 8)


def test_a_bad_stall_timeout_is_refused_before_anything_runs() -> None:
    with get_runner() as runner:
        with pytest.raises(ValueError, match="stall_timeout must be > 0"):
            runner.run(app(role("true")), "local_cwd", stall_timeout=0)
        assert runner.list("local_cwd") == []


def test_only_rank0_of_a_ddp_gang_counts(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import os, time\n"
        "from torchx.trackers import report_progress\n"
        "rank = int(os.environ['RANK'])\n"
        "for i in range(1, 4):\n"
        "    report_progress(i + 1000 * rank, total=3, rank=rank)\n"
        "    time.sleep(0.2)\n"
        "time.sleep(0.5 * rank)  # rank 1 reports last: it must still not count\n"
        "report_progress(999 + 1000 * rank, total=3, rank=rank)\n"
    )
    with get_runner() as runner:
        h = runner.run_component(
            "dist.ddp", ["-j", "1x2", "--script", str(script)], "local_cwd", stall_timeout=60
        )
        status = runner.wait(h, wait_interval=1, timeout=DEADLINE)
        assert status is not None and status.state == specs.AppState.SUCCEEDED, status
        progress = runner.progress(h)  # its ranks exited before SUCCEEDED was recorded
        assert progress is not None
        assert (progress.step, progress.metrics) == (999, {"rank": 0.0})
