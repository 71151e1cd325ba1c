"""The owner travels with the job: ``Runner.run(owner=...)`` on local_cwd is read back by
another runner (another process would read the same files), beside the idempotency token;
``torchx reap`` lists only owned apps and refuses bad input with one line."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from torchx.pipelines.owner import OWNER, Owner, airflow_owner, kfp_owner, owner_of
from torchx.runner import get_runner
from torchx.schedulers.api import IDEMPOTENCY_TOKEN


def _reap(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torchx.cli.main", "reap", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ))


def test_owner_is_stored_with_the_job_and_read_back_elsewhere() -> None:
    ti = SimpleNamespace(dag_id="d", run_id="manual__1", task_id="t", map_index=3, try_number=2)
    owner = airflow_owner(ti)
    key = f"owner-test/{uuid.uuid4().hex}"
    with get_runner() as runner:
        handle = runner.run_component(
            "utils.sh",
            ["sleep", "60"],
            "local_cwd",
            idempotency_key=key,
            owner=owner.to_metadata(),
        )
    try:
        with get_runner() as other:  # a fresh runner: no cache, the scheduler's state only
            appdef = other.describe(handle)
            assert appdef is not None
            assert appdef.metadata[IDEMPOTENCY_TOKEN].startswith("tx")
            got = owner_of(appdef.metadata)
        assert got == owner
        assert got is not None and got.ids == {
            "dag": "d",
            "run": "manual__1",
            "task": "t",
            "map": 3,
            "try": 2,
        }
        # no Airflow URL known: the app is kept, and one line says why (exit 1)
        listed = _reap("--dryrun")
        assert listed.returncode == 1
        assert f"kept {handle} owner: airflow dag=d run=manual__1 task=t map=3" in listed.stdout
        assert listed.stderr.strip().count("\n") == 0 and "--airflow_url" in listed.stderr
        assert "Traceback" not in listed.stderr
    finally:
        with get_runner() as runner:
            runner.cancel(handle)


def test_owner_builders() -> None:
    assert kfp_owner("{{$.pipeline_job_uuid}}", "t") is None
    k = kfp_owner("run-1", "train")
    assert k is not None and owner_of({OWNER: k.to_metadata()}) == k
    p = Owner("prefect", {"flow_run": "fr-1", "task_run": "tr-1"}, "http://prefect:4200/api")
    assert owner_of({OWNER: p.to_metadata()}) == p
    assert owner_of({OWNER: "not json"}) is None and owner_of({}) is None


def test_reap_bad_scheduler_is_one_line() -> None:
    out = _reap("-s", "nope")
    assert out.returncode != 0
    assert out.stderr.strip().count("\n") == 0 and "unknown scheduler nope" in out.stderr


def test_an_owner_that_keeps_its_job_is_never_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TorchXOperator(cancel_on_kill=False)`` stores ``"cancel": false`` with the owner:
    ``torchx reap`` lists the job as kept without asking Airflow (no URL is needed) and
    leaves it running; Airflow's listener reads the same field."""
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path))  # only this test's apps are listed
    ti = SimpleNamespace(dag_id="d", run_id="manual__2", task_id="t", map_index=-1, try_number=1)
    owner = airflow_owner(ti, cancel=False)
    assert '"cancel":false' in owner.to_metadata() and owner_of({OWNER: owner.to_metadata()})
    assert '"cancel"' not in airflow_owner(ti).to_metadata()  # the default: reapable
    with get_runner() as runner:
        handle = runner.run_component(
            "utils.sh", ["sleep", "60"], "local_cwd", owner=owner.to_metadata()
        )
    try:
        with get_runner() as other:
            appdef = other.describe(handle)
            got = owner_of(appdef.metadata if appdef else None)
        assert got == owner and got is not None and not got.cancel
        reaped = _reap()
        assert reaped.returncode == 0, reaped.stderr
        assert f"kept {handle} owner: airflow dag=d run=manual__2" in reaped.stdout
        assert "cancel: false" in reaped.stdout
        with get_runner() as other:
            status = other.status(handle)
        assert status is not None and not status.is_terminal(), status
    finally:
        with get_runner() as runner:
            runner.cancel(handle)
