"""Slurm against the real local cluster: the job's owner rides in its comment and comes back
from ``describe`` (so ``torchx reap`` sees it) from slurmctld and, once slurmctld forgot the
job, from accounting; rank 0's progress reports reach ``torchx status`` through a file in
the job's directory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.polling import poll_until
from tests.schedulers.test_slurm_scheduler import (  # noqa: F401  (cluster: the fixture)
    _tx,
    _wait_forgotten,
    _wait_terminal,
    cluster,
)
from torchx import specs
from torchx.components import utils
from torchx.pipelines.owner import owner_of
from torchx.pipelines.reap import Orchestrators, find_candidates
from torchx.runner import get_runner
from torchx.schedulers.api import IDEMPOTENCY_TOKEN, OWNER, idempotency_token
from torchx.schedulers.slurm.scheduler import create_scheduler

pytestmark = pytest.mark.slurm


@pytest.fixture()
def env(cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:  # noqa: F811
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TORCHX_TRACKERS", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# spaces, '|' (sacct's and squeue's separator), '%', quotes and a non-ASCII character
OWNER_DOC = '{"kind":"kfp","run":"run 1 | 100% ü","task":"train \\"a\\""}'

PROGRESS = """
import time
from torchx.trackers import report_progress
for i in range(1, 101):
    report_progress(i, total=100)
    time.sleep(0.5)
"""


def test_owner_comes_back_from_describe_while_running_and_from_accounting(env: Path) -> None:
    key = f"owner-test/{env.name}"
    want = {OWNER: OWNER_DOC, IDEMPOTENCY_TOKEN: idempotency_token(key)}
    with get_runner() as runner:
        handle = runner.run(
            utils.sh("sleep", "600"), "slurm", {}, idempotency_key=key, owner=OWNER_DOC
        )
        try:
            # another runner (not this one's cache) asks Slurm; squeue: slurmctld holds the job
            app = get_runner().describe(handle)
            assert app is not None and app.metadata == want
            candidates = find_candidates(get_runner(), ["slurm"], Orchestrators())
            found = [c for c in candidates if c.handle == handle]
            assert len(found) == 1 and found[0].owner == owner_of(want)
        finally:
            runner.cancel(handle)
    assert _wait_terminal(handle).state == specs.AppState.CANCELLED
    _wait_forgotten(specs.parse_app_handle(handle).app_id)
    app = get_runner().describe(handle)  # sacct: accounting keeps the comment
    assert app is not None and app.metadata == want


def test_a_job_without_owner_has_none(env: Path) -> None:
    with get_runner() as runner:
        handle = runner.run(utils.sh("true"), "slurm", {})
        assert _wait_terminal(handle).state == specs.AppState.SUCCEEDED
    app = get_runner().describe(handle)
    assert app is not None and app.metadata == {}


def test_progress_of_a_running_job_shows_in_torchx_status(env: Path) -> None:
    run = _tx("run", "-s", "slurm", "utils.python", "-c", PROGRESS)
    assert run.returncode == 0, run.stderr
    handle = run.stdout.splitlines()[0]
    try:
        status = poll_until(
            lambda: _tx("status", handle).stdout,
            # the first report has no rate yet: wait for one with a rate and an ETA
            lambda out: (
                re.search(r"progress: step ([1-9]\d*)/100, [\d.]+ steps/s, ETA", out) is not None
            ),
            timeout=180,
            every=1.0,
        )
        assert re.search(r"progress: step ([1-9]\d*)/100, [\d.]+ steps/s, ETA", status), status
        assert "State: RUNNING" in status, status
        job_id = specs.parse_app_handle(handle).app_id
        progress = create_scheduler("t").progress_path(job_id)  # in the job's directory
        assert progress and Path(progress).is_file(), progress
        assert Path(progress).parent != env  # not in the submitter's working directory
    finally:
        assert _tx("cancel", handle).returncode == 0
    assert _wait_terminal(handle).state == specs.AppState.CANCELLED
