"""The stall tests' shared shape on a real scheduler (Slurm, Ray): a tracked job that
reports one step and then stays silent is stopped by its watchdog, and every later
reader (a fresh runner, the MLflow run) sees the same ``stalled: ...`` reason."""

from __future__ import annotations

from pathlib import Path
from typing import Tuple

import pytest

from tests.polling import poll_until
from tests.processes import job_processes, wait_for_job_processes
from tests.trackers.test_job_run import the_run
from torchx import specs
from torchx.runner import get_runner
from torchx.runner.tracking import FAILURE_REASON_TAG

DEADLINE = 300  # generous: the machine is shared; nothing here asserts a time
STALLS = (
    "import time; from torchx.trackers import report_progress\n"
    "report_progress(1, total=10); print('reported', flush=True); time.sleep(300)\n"
)
PRINTS = "import time\nfor i in range(20):\n    print('tick', i, flush=True); time.sleep(1)\n"


def wait_out_a_silent_tracked_job(
    scheduler: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: int = 1
) -> Tuple[str, specs.AppStatus, str]:
    """Run ``STALLS`` with a 10 s stall timeout on a new sqlite store and wait on it: its
    handle, the FAILED status ``wait`` returned, and the store. ``processes``: the
    replica's processes (with its watchdog, if one wraps it)."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", store)
    with get_runner() as runner:
        handle = runner.run_component("utils.python", ["--c", STALLS], scheduler, stall_timeout=10)
        wait_for_job_processes(handle, processes, timeout=120)  # the replica runs
        status = runner.wait(handle, wait_interval=1, timeout=DEADLINE)
    assert status is not None and status.state == specs.AppState.FAILED, status
    return handle, status, store


def assert_every_reader_sees_it_stalled(handle: str, reason: str, store: str) -> None:
    """Another process reads the reason from the job; no process of it is left; its run
    ended FAILED with the reason as a tag."""
    with get_runner(trackers={}) as fresh:
        seen = fresh.status(handle)
        assert seen is not None and seen.state == specs.AppState.FAILED and seen.msg == reason
    left = poll_until(lambda: job_processes(handle), lambda procs: not procs, timeout=60)
    assert left == [], [p.info["cmdline"] for p in left]
    run = the_run(store, handle)
    assert run.info.status == "FAILED"
    assert run.data.tags[FAILURE_REASON_TAG] == reason
