"""Slurm against the real local cluster: the job's owner rides in its comment and comes back
from ``describe`` (so ``torchx reap`` sees it) from slurmctld and, once slurmctld forgot the
job, from accounting; rank 0's progress reports reach ``torchx status`` through a file in
the job's directory."""

from __future__ import annotations

from pathlib import Path

import pytest

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

pytestmark = pytest.mark.slurm


@pytest.fixture()
def env(cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:  # noqa: F811
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TORCHX_TRACKERS", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# spaces, '|' (sacct's and squeue's separator), '%', quotes and a non-ASCII character
OWNER_DOC = '{"kind":"kfp","run":"run 1 | 100% ü","task":"train \\"a\\""}'


def test_owner_comes_back_from_describe_while_running_and_from_accounting(env: Path) -> None:
    key = f"owner-test/{env.name}"
    want = {OWNER: OWNER_DOC, IDEMPOTENCY_TOKEN: idempotency_token(key)}
    with get_runner() as runner:
        handle = runner.run(
            utils.sh("sleep", "600"), "slurm", {}, idempotency_key=key, owner=OWNER_DOC
        )
        try:
            app = runner.describe(handle)  # squeue: slurmctld holds the job
            assert app is not None and app.metadata == want
            found = [
                c for c in find_candidates(runner, ["slurm"], Orchestrators()) if c.handle == handle
            ]
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
        app = runner.describe(handle)
    assert app is not None and app.metadata == {}
