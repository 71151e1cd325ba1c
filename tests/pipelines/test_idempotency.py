"""Idempotent submission: the key lives with the scheduler's job, not in a worker's files.

Every "worker" here is its own process with its own ``$TORCHX_HOME`` for its own files
where the scheduler allows it (Slurm), so nothing but the scheduler can carry the key.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from torchx.runner import get_runner
from torchx.specs import AppState

SUBMIT = textwrap.dedent("""
    import json, sys
    from torchx.runner import get_runner
    scheduler, key, cfg, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4:]
    with get_runner(trackers={}) as runner:
        print(runner.run_component("utils.sh", args, scheduler, cfg, idempotency_key=key))
""")


def _worker(home: Path, scheduler: str, key: str, cfg: Dict[str, Any], *args: str) -> Any:
    env = dict(os.environ, TORCHX_HOME=str(home))
    return subprocess.Popen(
        [sys.executable, "-c", SUBMIT, scheduler, key, json.dumps(cfg), *args],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def _handle(proc: Any) -> str:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return out.strip().splitlines()[-1]


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TORCHX_TRACKERS", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


def _wait_state(runner: Any, handle: str, states: List[AppState], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    status = runner.status(handle)
    while (status is None or status.state not in states) and time.monotonic() < deadline:
        time.sleep(0.1)
        status = runner.status(handle)
    assert status is not None and status.state in states, status


def test_running_app_is_reattached_succeeded_only_on_request_failed_never(home: Path) -> None:
    with get_runner(trackers={}) as runner:
        first = runner.run_component("utils.sh", ["sleep", "30"], "local_cwd", idempotency_key="a")
        again = runner.run_component("utils.sh", ["sleep", "30"], "local_cwd", idempotency_key="a")
        assert again == first  # still running: re-attached, nothing submitted
        other = runner.run_component("utils.sh", ["true"], "local_cwd", idempotency_key="b")
        assert other != first  # another key is another app
        runner.cancel(first)
        _wait_state(runner, first, [AppState.CANCELLED])
        after_cancel = runner.run_component("utils.sh", ["true"], "local_cwd", idempotency_key="a")
        assert after_cancel != first  # a CANCELLED app is never re-attached

        assert runner.wait(other, wait_interval=1).state == AppState.SUCCEEDED  # type: ignore[union-attr]
        rerun = runner.run_component("utils.sh", ["true"], "local_cwd", idempotency_key="b")
        assert rerun != other  # a succeeded app runs again unless asked to reuse it
        runner.wait(rerun, wait_interval=1)
        reused = runner.run_component(
            "utils.sh", ["true"], "local_cwd", idempotency_key="b", reattach_succeeded=True
        )
        assert reused == rerun

        failed = runner.run_component("utils.sh", ["false"], "local_cwd", idempotency_key="c")
        assert runner.wait(failed, wait_interval=1).state == AppState.FAILED  # type: ignore[union-attr]
        retried = runner.run_component(
            "utils.sh", ["false"], "local_cwd", idempotency_key="c", reattach_succeeded=True
        )
        assert retried != failed  # a FAILED app is never re-attached


def test_a_stage_submit_or_reattach_looks_the_key_up_once(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One scheduler lookup per keyed submit (not one by the pipeline adapter, one by
    ``Runner.run`` and one after the launch); where the key is claimed (``local_cwd``)
    nothing is reconciled after the fact."""
    from torchx.pipelines import core
    from torchx.schedulers.local.scheduler import LocalScheduler

    lookups: List[str] = []
    find = LocalScheduler.find_by_idempotency_token

    def counted(self: LocalScheduler, token: str, cfg: Any = None) -> Any:
        lookups.append(token)
        return find(self, token, cfg)

    monkeypatch.setattr(LocalScheduler, "find_by_idempotency_token", counted)
    with get_runner(trackers={}) as runner:
        first = core.submit_or_attach(runner, "utils.sh", ["sleep", "30"], "local_cwd", {}, "k")
        assert not runner.reattached(first) and len(lookups) == 1, lookups
        again = core.submit_or_attach(runner, "utils.sh", ["sleep", "30"], "local_cwd", {}, "k")
        assert runner.reattached(again) and again == first and len(lookups) == 2, lookups
        runner.cancel(first)


def test_two_processes_racing_with_one_key_end_with_one_live_app(home: Path) -> None:
    workers = [_worker(home, "local_cwd", "race", {}, "sleep", "30") for _ in range(2)]
    handles = {_handle(w) for w in workers}
    assert len(handles) == 1, handles  # both return the same handle
    with get_runner(trackers={}) as runner:
        live = [a for a in runner.list("local_cwd") if not _terminal(a.state)]
        assert [a.app_handle for a in live] == list(handles)
        runner.cancel(handles.pop())


def _terminal(state: AppState) -> bool:
    return state in (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED)


def _slurm_up() -> bool:
    return (
        shutil.which("sinfo") is not None
        and subprocess.run(["sinfo"], capture_output=True, timeout=30).returncode == 0
    )


@pytest.mark.slurm
def test_another_workers_retry_reattaches_on_slurm(tmp_path: Path) -> None:
    """Worker A submits and dies; worker B, with its own $TORCHX_HOME, retries: one job."""
    if not _slurm_up():
        pytest.skip("no running Slurm cluster (bash scripts/slurm_cluster.sh start)")
    key = f"dag/train/{tmp_path.name}"
    cfg = {"job_dir": str(tmp_path / "job")}
    first = _handle(_worker(tmp_path / "worker-a", "slurm", key, cfg, "sleep", "60"))
    second = _handle(_worker(tmp_path / "worker-b", "slurm", key, cfg, "sleep", "60"))
    assert second == first
    app_id = first.rsplit("/", 1)[1]
    try:
        jobs = subprocess.run(
            ["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, timeout=30
        ).stdout.split("\n")
        name = [j.split()[1] for j in jobs if j.split() and j.split()[0] == app_id]
        assert name, (app_id, jobs)
        same_name = [j for j in jobs if j.split() and j.split()[1] == name[0]]
        assert len(same_name) == 1, same_name  # one Slurm job, not two
    finally:
        with get_runner(trackers={}) as runner:
            runner.cancel(first)
