"""Racing submitters: many processes call ``Runner.run(..., idempotency_key=K)`` at once.

Every caller must get the same handle, the survivor's, and it must not be cancelled.
``local_cwd`` claims the key before launching, so exactly one app starts its command; Slurm
submits held and releases only the winner, so no loser's command runs either.

Each worker is a real process; they wait on a start file so that their ``run`` calls
overlap. Each app's command appends its handle to a file: its lines are the apps that
started their command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from tests.polling import poll, poll_until
from torchx.runner import get_runner
from torchx.schedulers import get_scheduler_factories
from torchx.specs import AppState

WORKER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from torchx.components.utils import sh
    from torchx.runner import get_runner
    scheduler, key, cfg, started, ready, go, seconds, tracked = sys.argv[1:9]
    app = sh("sh", "-c", f'echo "$TORCHX_JOB_ID" >> {started}; sleep {seconds}')
    with get_runner(**({} if tracked == "tracked" else {"trackers": {}})) as runner:
        runner._scheduler(scheduler)  # import the scheduler before the start line
        Path(ready, str(os.getpid())).touch()
        while not os.path.exists(go):
            time.sleep(0.002)
        handle = runner.run(app, scheduler, json.loads(cfg), idempotency_key=key)
        print(handle, flush=True)
""")


def race(
    tmp: Path,
    scheduler: str,
    key: str,
    n: int,
    cfg: Optional[Dict[str, Any]] = None,
    homes: Optional[List[Path]] = None,
    seconds: int = 3,
    tracked: bool = False,
) -> tuple[List[str], Path]:
    """Start ``n`` workers, let them all call ``run`` at once; their handles and the file
    each started app writes a line to."""
    round_dir = tmp / key.replace("/", "_")
    ready = round_dir / "ready"
    ready.mkdir(parents=True)
    go = round_dir / "go"
    started = round_dir / "started"
    started.touch()
    procs = []
    for i in range(n):
        env = dict(os.environ)
        if homes:
            env["TORCHX_HOME"] = str(homes[i % len(homes)])
        args = [scheduler, key, json.dumps(cfg or {}), str(started), str(ready), str(go)]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER, *args, str(seconds), "tracked" * tracked],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        poll(lambda: len(os.listdir(ready)) >= n or None, timeout=180, what="workers ready")
        go.touch()
        handles = []
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, err[-2000:]
            handles.append(out.strip().splitlines()[-1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return handles, started


def _started_apps(started: Path) -> List[str]:
    return [line for line in started.read_text().splitlines() if line]


def _settled(scheduler: str, key: str) -> List[Any]:
    """Every app of the key once none is live any more (the key's apps, oldest first)."""
    from torchx.schedulers.api import idempotency_token

    sched = get_scheduler_factories()[scheduler]("torchx")
    token = idempotency_token(key)

    def apps() -> List[Any]:
        return sched.find_by_idempotency_token(token)

    return poll_until(apps, lambda a: all(x.state.name in _TERMINAL for x in a), timeout=120)


_TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("TORCHX_HOME", str(home))
    monkeypatch.delenv("TORCHX_TRACKERS", raising=False)
    monkeypatch.chdir(tmp_path)
    return home


def test_twenty_racing_submitters_get_one_handle_and_one_app_runs(
    home: Path, tmp_path: Path
) -> None:
    for round_no in range(3):
        key = f"race-{round_no}"
        handles, started = race(tmp_path, "local_cwd", key, 20)
        assert len(set(handles)) == 1, sorted(set(handles))
        handle = handles[0]
        with get_runner(trackers={}) as runner:
            status = runner.wait(handle, wait_interval=1, timeout=120)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        apps = _settled("local_cwd", key)
        assert [a.app_id for a in apps] == [handle.rsplit("/", 1)[1]], apps  # one submitted
        assert _started_apps(started) == [handle]  # exactly one app started its command


def test_tracked_racers_that_re_attach_end_their_runs_killed_naming_the_winner(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tracked submit opens its run before it claims the key; one that loses the claim
    launches nothing, so its run ends KILLED (nothing failed) tagged with the winner's
    handle. Rounds go on until a round had such a loser (a loser that finds the winner's
    app listed opens no run at all)."""
    from mlflow import MlflowClient

    from torchx.runner.tracker_session import REATTACHED_TO_TAG

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", store)
    with get_runner() as runner:  # the store exists before the race (as after any first job)
        runner.wait(runner.run_component("utils.sh", ["true"], "local_cwd"), wait_interval=0.2)
    client = MlflowClient(store)
    exps = [e.experiment_id for e in client.search_experiments()]
    seen = {r.info.run_id for r in client.search_runs(exps)}  # the first job's
    superseded: List[Any] = []
    for round_no in range(6):
        key = f"tracked-race-{round_no}"
        # the app outlives the race: a racer slowed past the app's end (each racer opens its
        # run on one sqlite store first) would rightly start the key again, not re-attach
        handles, _ = race(tmp_path, "local_cwd", key, 8, seconds=10, tracked=True)
        assert len(set(handles)) == 1, sorted(set(handles))
        with get_runner() as runner:  # ends the winner's run
            status = runner.wait(handles[0], wait_interval=0.2, timeout=120)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        runs = [r for r in client.search_runs(exps, max_results=1000) if r.info.run_id not in seen]
        seen.update(r.info.run_id for r in runs)
        winners = [r for r in runs if r.data.tags.get("torchx.job_id") == handles[0]]
        assert [r.info.status for r in winners] == ["FINISHED"], winners
        losers = [r for r in runs if r not in winners]  # each opened a run, launched nothing
        assert all(r.info.status == "KILLED" for r in losers), losers
        assert all(r.data.tags.get(REATTACHED_TO_TAG) == handles[0] for r in losers), losers
        superseded += losers
        if superseded:
            break
    assert superseded, "no round had a submitter that lost the claim"
    failed = client.search_runs(exps, filter_string="attributes.status = 'FAILED'")
    assert failed == [], failed


def _slurm_up() -> bool:
    return (
        shutil.which("sinfo") is not None
        and subprocess.run(["sinfo"], capture_output=True, timeout=30).returncode == 0
    )


@pytest.mark.slurm
def test_racing_submitters_get_one_handle_and_one_job_runs_on_slurm(tmp_path: Path) -> None:
    """Six workers, each with its own $TORCHX_HOME (only Slurm carries the key), twice."""
    if not _slurm_up():
        pytest.skip("no running Slurm cluster (bash scripts/slurm_cluster.sh start)")
    tmp_path.chmod(0o755)
    homes = [tmp_path / f"worker-{i}" for i in range(6)]
    for round_no in range(2):
        key = f"slurm-race/{uuid.uuid4().hex}/{round_no}"  # Slurm remembers older tests' jobs
        cfg = {"job_dir": str(tmp_path / "job")}
        handles, started = race(tmp_path, "slurm", key, 6, cfg, homes, seconds=2)
        assert len(set(handles)) == 1, sorted(set(handles))
        handle = handles[0]
        with get_runner(trackers={}) as runner:
            status = runner.wait(handle, wait_interval=1, timeout=120)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        apps = _settled("slurm", key)
        winner = handle.rsplit("/", 1)[1]
        assert winner == apps[0].app_id, apps  # the oldest job won
        assert all(a.state == AppState.CANCELLED for a in apps[1:]), apps
        assert _started_apps(started) == [handle]  # no loser's command ran


@pytest.mark.slurm
def test_a_held_winner_whose_submitter_died_is_released_by_the_retry_on_slurm(
    tmp_path: Path,
) -> None:
    """A keyed Slurm job is submitted held and released once it won its key. Its submitter
    died in between (it submitted, never looked the key up): the retry re-attaches to that
    job, whose lookup releases it, and the job runs to its end."""
    from torchx.components.utils import sh
    from torchx.schedulers.api import IDEMPOTENCY_TOKEN, idempotency_token

    if not _slurm_up():
        pytest.skip("no running Slurm cluster (bash scripts/slurm_cluster.sh start)")
    tmp_path.chmod(0o755)
    key = f"slurm-held/{uuid.uuid4().hex}"  # Slurm remembers older tests' jobs
    cfg = {"job_dir": str(tmp_path / "job")}
    app = sh("true")
    app.metadata[IDEMPOTENCY_TOKEN] = idempotency_token(key)
    held = get_scheduler_factories()["slurm"]("torchx").submit(app, cfg)
    with get_runner(trackers={}) as runner:
        handle = runner.run(sh("true"), "slurm", cfg, idempotency_key=key)
        assert handle.rsplit("/", 1)[1] == held
        status = runner.wait(handle, wait_interval=1, timeout=120)
    assert status is not None and status.state == AppState.SUCCEEDED, status
