"""The MLflow backend against real MLflow: sqlite stores, real torchx jobs, a real server."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.mlflow_server import free_port
from torchx import specs
from torchx.runner import get_runner
from torchx.trackers.api import TrackerConfigError, build_trackers, tracker_backend

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture()
def mlflow_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", uri)
    monkeypatch.delenv("TORCHX_PARENT_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    return uri


def _run(runner, component: str, args: list, parent: str | None = None) -> specs.AppStatus:  # type: ignore[no-untyped-def]
    handle = runner.run_component(
        f"{EXAMPLES}/components.py:{component}", args, "local_cwd", parent_run_id=parent
    )
    status = runner.wait(handle, wait_interval=1, timeout=600)
    assert status is not None
    return handle, status


@pytest.mark.slow
def test_pipeline_lineage_with_a_2x2_ddp_job(mlflow_env: str, tmp_path: Path) -> None:
    from torchx.pipelines.core import open_pipeline_run

    open_pipeline_run("pipeline://test/1", {"mlflow": mlflow_env}, name="test")
    tracker = build_trackers({"mlflow": mlflow_env})[0]
    d, m, e = (str(tmp_path / x) for x in ("data", "model", "eval"))
    with get_runner() as runner:
        prep, s1 = _run(
            runner, "datapreproc", ["--output_path", d, "--limit", "400"], "pipeline://test/1"
        )
        train, s2 = _run(
            runner,
            "trainer",
            [
                "--data_path",
                d,
                "--output_path",
                m,
                "--checkpoint_path",
                str(tmp_path / "c"),
                "-j",
                "2x2",
                "--epochs",
                "2",
                "--rdzv_port",
                "29611",
            ],
            "pipeline://test/1",
        )
        ev, s3 = _run(
            runner,
            "evaluate",
            ["--model_path", m, "--data_path", d, "--output_path", e],
            "pipeline://test/1",
        )
    assert [s.state for s in (s1, s2, s3)] == [specs.AppState.SUCCEEDED] * 3, (s1, s2, s3)

    tracker = build_trackers({"mlflow": mlflow_env})[0]
    runs = list(tracker.run_ids())
    assert runs.count(train) == 1 and len(runs) == 4  # one run for the 4-process DDP job
    edges = {(x.source, x.target, x.artifact) for x in tracker.lineage(ev).edges}
    assert edges == {(train, ev, "model"), (prep, ev, "dataset"), (prep, train, "dataset")}
    assert sorted(tracker.run_ids(parent_run_id="pipeline://test/1")) == sorted([prep, train, ev])

    # the same links through MLflow's own client (what the UI shows)
    client = tracker.client
    parent_id = tracker.mlflow_run_id("pipeline://test/1")
    ev_run = client.get_run(tracker.mlflow_run_id(ev))
    train_mlflow_id = tracker.mlflow_run_id(train)
    assert ev_run.data.tags["mlflow.parentRunId"] == parent_id
    sources = [i.dataset.source for i in ev_run.inputs.dataset_inputs]
    assert any(f"runs:/{train_mlflow_id}/model" in s for s in sources)
    assert ev_run.info.status == "FINISHED" and "test_accuracy" in ev_run.data.metrics
    train_run = client.get_run(train_mlflow_id)
    assert len(client.get_metric_history(train_mlflow_id, "final_loss")) == 1
    assert "model" in [a.path for a in client.list_artifacts(train_mlflow_id)]
    assert train_run.data.tags["stage"] == "train"

    out = subprocess.run(
        [sys.executable, "-m", "torchx.cli.main", "tracker", "lineage", ev],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert (
        f"<- model <- {train} [train]" in out.stdout
        and f"<- dataset <- {prep} [datapreproc]" in out.stdout
    )


def test_failed_stage_leaves_its_run_failed(mlflow_env: str, tmp_path: Path) -> None:
    code = textwrap.dedent("""
        from torchx.tracker import app_run_from_env
        app_run_from_env().log_metrics({"loss": 1.5}, step=1)
        raise RuntimeError("boom")
    """)
    app = specs.AppDef("failing", [specs.Role("w", ".", entrypoint="python", args=["-c", code])])
    with get_runner() as runner:
        h = runner.run(app, "local_cwd")
        assert runner.wait(h, timeout=120).state == specs.AppState.FAILED
    tracker = build_trackers({"mlflow": mlflow_env})[0]
    run = tracker.client.get_run(tracker.mlflow_run_id(h))
    assert run.info.status == "FAILED" and run.data.metrics["loss"] == 1.5


def test_unreachable_server_fails_fast_at_submit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", f"http://127.0.0.1:{free_port()}")
    reason = r"unreachable \(Failed to establish a new connection: .*refused\)"  # urllib3's
    with get_runner() as runner, pytest.raises(TrackerConfigError, match=reason):
        runner.run(specs.AppDef("x", [specs.Role("w", ".", entrypoint="true")]), "local_cwd")
    with pytest.raises(TrackerConfigError, match="not writable|does not exist"):
        tracker_backend("mlflow", "sqlite:////nonexistent/dir/mlflow.db").validate()


def test_lineage_cli_accepts_mlflow_run_ids_and_draws_a_pipeline_with_its_stages(
    mlflow_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs written through the tracker API the way stages write them (no jobs needed)."""
    from torchx.pipelines.core import open_pipeline_run

    monkeypatch.delenv("TORCHX_JOB_ID", raising=False)
    pipeline = "airflow://dag/run-1"
    open_pipeline_run(pipeline, {"mlflow": mlflow_env}, orchestrator="airflow")
    tracker = build_trackers({"mlflow": mlflow_env})[0]
    tracker.set_parent("local_cwd://torchx/prep-1", pipeline)
    tracker.add_artifact("local_cwd://torchx/prep-1", "dataset", "/data", {"digest": "d1"})
    tracker.set_parent("local_cwd://torchx/train-1", pipeline)
    tracker.add_source("local_cwd://torchx/train-1", "local_cwd://torchx/prep-1", "dataset")

    torchx = os.path.join(os.path.dirname(sys.executable), "torchx")
    out = subprocess.run(
        [torchx, "tracker", "lineage", pipeline], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "stage local_cwd://torchx/prep-1" in out.stdout
    assert "stage local_cwd://torchx/train-1" in out.stdout
    assert "<- dataset <- local_cwd://torchx/prep-1" in out.stdout

    mlflow_id = tracker.mlflow_run_id("local_cwd://torchx/train-1")  # type: ignore[attr-defined]
    out = subprocess.run(
        [torchx, "tracker", "lineage", mlflow_id, "--format", "mermaid"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "|dataset|" in out.stdout and "local_cwd://torchx/train-1" in out.stdout


RACE = textwrap.dedent("""
    import os, sys, time
    from torchx.trackers import mlflow_backend

    mlflow_backend.create(sys.argv[2])  # import mlflow (and sqlalchemy) once, before forking
    start, kids = time.time() + 2, []
    for _ in range(4):  # processes that open one new store at the same moment
        pid = os.fork()
        if pid == 0:
            while time.time() < start:
                pass
            code = 1
            try:
                mlflow_backend.create(sys.argv[1]).client.search_experiments()
                code = 0
            finally:
                os._exit(code)
        kids.append(pid)
    print(sum(os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) == 0 for k in kids))
""")


def test_processes_opening_a_new_sqlite_store_at_once_all_succeed(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = subprocess.run(
        [sys.executable, "-c", RACE, uri, f"sqlite:///{tmp_path / 'warm.db'}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.stdout.strip() == "4", run.stderr[-3000:]
    assert build_trackers({"mlflow": uri})[0].client.search_experiments()  # type: ignore[attr-defined]
