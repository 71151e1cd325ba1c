"""The launcher-owned job run: real MLflow (sqlite, and a real server over REST), real
local_cwd jobs. Runs are opened in the background, so every check polls to a deadline."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List

import pytest

from torchx import specs
from torchx.runner import get_runner
from torchx.trackers.api import build_trackers, start_pipeline_run

DEADLINE = 240.0  # the agent's first `import mlflow` takes 5-30 s on a loaded 2-core machine


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", uri)
    monkeypatch.delenv("TORCHX_PARENT_RUN_ID", raising=False)
    monkeypatch.delenv("TORCHX_JOB_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    # create the store's schema first: MLflow's migrations break a fresh sqlite store that
    # two processes (this test's reader and the launcher's agent) initialize at once
    build_trackers({"mlflow": uri})[0].run_ids()
    return uri


def job_runs(uri: str, handle: str) -> List[Any]:
    client = build_trackers({"mlflow": uri})[0].client  # type: ignore[attr-defined]
    exps = [e.experiment_id for e in client.search_experiments()]
    if not exps:
        return []
    return list(client.search_runs(exps, filter_string=f"tags.`torchx.job_id` = '{handle}'"))


def _poll(uri: str, handle: str) -> List[Any]:
    try:
        return job_runs(uri, handle)
    except Exception as e:  # the agent may be creating the fresh store's schema right now
        if "OperationalError" not in type(e).__name__:
            raise
        return []


def ended_run(uri: str, handle: str, status: str) -> Any:
    """The job's one run, once it has ended as ``status`` (fails at the deadline)."""
    deadline = time.monotonic() + DEADLINE
    runs = _poll(uri, handle)
    while not (runs and runs[0].info.status == status) and time.monotonic() < deadline:
        time.sleep(0.5)
        runs = _poll(uri, handle)
    assert [r.info.status for r in runs] == [status], f"runs of {handle}: {runs}"
    return runs[0]


def test_a_job_that_never_calls_the_tracker_gets_one_finished_run(store: str) -> None:
    with get_runner() as runner:
        handle = runner.run_component(
            "utils.sh",
            ["echo", "hi"],
            "local_cwd",
            run_name="prep",
            run_params={"dag_id": "d1", "epochs": 3},
        )
        assert runner.wait(handle, wait_interval=1, timeout=120).state == specs.AppState.SUCCEEDED
    run = ended_run(store, handle, "FINISHED")
    assert run.info.run_name == "prep"
    assert run.data.params == {
        "dag_id": "d1",
        "epochs": "3",
        "component": "utils.sh",
        "args": "echo hi",
        "scheduler": "local_cwd",
        "cfg": "{}",
        "resources.sh.replicas": "1",
        "resources.sh.cpu": "1",
        "resources.sh.memMB": "1024",
        "resources.sh.gpu": "0",
    }
    assert run.info.start_time <= run.info.end_time


def test_submitting_and_waiting_never_imports_mlflow(store: str) -> None:
    code = (
        "import sys; from torchx.runner import get_runner\n"
        "with get_runner() as r:\n"
        "    h = r.run_component('utils.sh', ['true'], 'local_cwd')\n"
        "    r.wait(h, wait_interval=1, timeout=120)\n"
        "print(h, 'mlflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    handle, imported = out.stdout.split()
    assert imported == "False", out.stderr
    ended_run(store, handle, "FINISHED")


def test_a_failing_job_ends_failed_and_a_cancelled_one_killed(store: str) -> None:
    with get_runner() as runner:
        failing = runner.run_component("utils.sh", ["exit", "3"], "local_cwd")
        sleeping = runner.run_component("utils.sh", ["sleep", "600"], "local_cwd")
        assert runner.wait(failing, wait_interval=1, timeout=120).state == specs.AppState.FAILED
        runner.cancel(sleeping)
    ended_run(store, failing, "FAILED")
    run = ended_run(store, sleeping, "KILLED")
    assert run.info.run_name == "sh"  # no run_name: the app's name


def test_a_stage_run_nests_under_its_pipeline_run(store: str) -> None:
    parent = start_pipeline_run("airflow://dag/run-1", {"mlflow": store})[0]
    parent_id = parent.mlflow_run_id("airflow://dag/run-1")  # type: ignore[attr-defined]
    with get_runner() as runner:
        handle = runner.run(
            specs.AppDef("train", [specs.Role("w", "/", entrypoint="true")]),
            "local_cwd",
            parent_run_id="airflow://dag/run-1",
            run_name="train-stage",
        )
        runner.wait(handle, wait_interval=1, timeout=120)
    run = ended_run(store, handle, "FINISHED")
    assert run.data.tags["mlflow.parentRunId"] == parent_id
    assert run.data.tags["torchx.parent_run_id"] == "airflow://dag/run-1"
    assert run.info.experiment_id == parent.client.get_run(parent_id).info.experiment_id  # type: ignore[attr-defined]
    assert list(parent.run_ids(parent_run_id="airflow://dag/run-1")) == [handle]


def test_a_rank_attaches_to_the_launcher_run_and_does_not_end_it(store: str) -> None:
    """The rank logs through its agent and exits 0 before the app is seen to end: the run
    is ended by the launcher (FINISHED), with the rank's metrics and tags."""
    code = (
        "from torchx.tracker import app_run_from_env as r; "
        "r().log_metrics({'loss': 0.5}, step=1); r().add_metadata(stage='s')"
    )
    with get_runner() as runner:
        handle = runner.run_component("utils.python", ["--c", code], "local_cwd", run_name="py")
        status = runner.wait(handle, wait_interval=1, timeout=DEADLINE)
        assert status.state == specs.AppState.SUCCEEDED, status
    run = ended_run(store, handle, "FINISHED")
    assert run.data.metrics == {"loss": 0.5} and run.data.tags["stage"] == "s"


@pytest.mark.slow
def test_ranks_of_a_ddp_job_attach_to_one_run(store: str, tmp_path: Path) -> None:
    script = tmp_path / "ddp.py"
    script.write_text(
        "import os\n"
        "from torchx.tracker import app_run_from_env as r\n"
        "rank = os.environ['RANK']\n"
        "r().log_metrics({'rank' + rank: 1.0})\n"
        "r().add_metadata(**{'seen_rank' + rank: 'yes'})\n"
    )
    with get_runner() as runner:
        handle = runner.run_component(
            "dist.ddp", ["-j", "1x2", "--script", str(script)], "local_cwd", run_name="ddp"
        )
        status = runner.wait(handle, wait_interval=1, timeout=600)
        assert status.state == specs.AppState.SUCCEEDED, status
    run = ended_run(store, handle, "FINISHED")
    assert run.data.metrics == {"rank0": 1.0, "rank1": 1.0}
    assert run.data.params["resources.ddp.replicas"] == "1"
    assert {run.data.tags["seen_rank0"], run.data.tags["seen_rank1"]} == {"yes"}


@pytest.mark.slow
def test_over_rest_the_run_exists_when_submit_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.mlflow_server import mlflow_server

    with mlflow_server(tmp_path / "server") as url:
        monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
        monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
        monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", url)
        monkeypatch.delenv("TORCHX_PARENT_RUN_ID", raising=False)
        with get_runner() as runner:
            handle = runner.run_component(
                "utils.sh", ["sleep", "600"], "local_cwd", run_name="long"
            )
            assert [r.info.status for r in job_runs(url, handle)] == ["RUNNING"]
            runner.cancel(handle)
        run = ended_run(url, handle, "KILLED")
        assert run.info.run_name == "long" and run.data.params["component"] == "utils.sh"
        tracker = build_trackers({"mlflow": url})[0]
        assert tracker.run_url(handle) == (
            f"{url}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
        )
