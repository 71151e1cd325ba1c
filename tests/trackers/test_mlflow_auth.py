"""Tracking into an MLflow server that asks for credentials: one real ``mlflow server
--app-name basic-auth`` for the module, real local_cwd jobs.

The submitter reaches it with MLflow's own ``MLFLOW_TRACKING_USERNAME``/``PASSWORD`` (or
credentials in the URI); the job's ranks get them in the job's env, as MLflow's variables.
They appear in no param, tag, link or message.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from tests.mlflow_server import mlflow_server
from torchx import specs
from torchx.pipelines.core import open_pipeline_run
from torchx.runner import get_runner
from torchx.trackers.api import JobRun, build_trackers, tracker_backend

USER, PASSWORD = "torchx-admin", "pw-" + os.urandom(8).hex()

# a rank records an output and an input (its lineage) into the job's run
LINEAGE = textwrap.dedent("""
    import os, sys
    from torchx.trackers import record_input, record_output
    out = os.path.join(sys.argv[1], "data.txt")
    open(out, "w").write("rows")
    record_output(out, "data", {"type": "dataset"})
    record_input(sys.argv[2]) if len(sys.argv) > 2 else None
""")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with mlflow_server(tmp_path_factory.mktemp("mlflow_auth"), admin=(USER, PASSWORD)) as url:
        yield url


@pytest.fixture()
def url(server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", server)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    for var in ("TORCHX_PARENT_RUN_ID", "TORCHX_JOB_ID", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return server


def job_runs(handle: str) -> List[Any]:
    """The runs tagged with ``handle``, read by MLflow's own client (with the env's login)."""
    from mlflow import MlflowClient

    client = MlflowClient(os.environ["TORCHX_TRACKER_MLFLOW_CONFIG"])
    exps = [e.experiment_id for e in client.search_experiments()]
    return list(client.search_runs(exps, filter_string=f"tags.`torchx.job_id` = '{handle}'"))


def recorded(run: Any) -> str:
    """Everything the run records as text: params, tags, metrics."""
    return repr((run.data.params, run.data.tags, run.data.metrics))


def lineage_app(out_dir: Path, *inputs: str) -> specs.AppDef:
    args = ["-c", LINEAGE, str(out_dir), *inputs]
    return specs.AppDef("lineage", [specs.Role("w", ".", entrypoint=sys.executable, args=args)])


def test_a_tracked_job_and_its_ranks_lineage_land_in_the_server(url: str, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with get_runner() as runner:
        producer = runner.run(lineage_app(tmp_path / "a"), "local_cwd")
        assert runner.wait(producer, timeout=240).state == specs.AppState.SUCCEEDED
        consumer = runner.run(
            lineage_app(tmp_path / "b", str(tmp_path / "a" / "data.txt")), "local_cwd"
        )
        assert runner.wait(consumer, timeout=240).state == specs.AppState.SUCCEEDED
    (made,), (used,) = job_runs(producer), job_runs(consumer)
    assert made.info.status == used.info.status == "FINISHED"
    assert made.data.tags["torchx.artifact.data.type"] == "dataset"
    assert used.data.tags["torchx.source.data"] == f"runs:/{made.info.run_id}/data"
    tracker = build_trackers({"mlflow": url})[0]
    assert [s.source_run_id for s in tracker.sources(consumer)] == [producer]
    assert PASSWORD not in recorded(made) + recorded(used)
    described = subprocess.run(
        [sys.executable, "-m", "torchx.cli.main", "describe", producer],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "MLFLOW_TRACKING_PASSWORD: '***'" in described and PASSWORD not in described


def test_the_job_env_carries_mlflows_own_settings(url: str) -> None:
    """Ranks on another host get the login as MLflow's own variables, not from this process."""
    opened = tracker_backend("mlflow", url).open_job_run(JobRun("j", {}))
    assert opened.env["MLFLOW_TRACKING_USERNAME"] == USER
    assert opened.env["MLFLOW_TRACKING_PASSWORD"] == PASSWORD
    assert opened.env["MLFLOW_TRACKING_URI"] == url


def test_a_pipeline_stage_lands_nested_under_its_pipeline_run(url: str) -> None:
    pipeline = f"prefect://flow/{os.urandom(4).hex()}"
    open_pipeline_run(pipeline, {"mlflow": url}, orchestrator="prefect")
    tracker = build_trackers({"mlflow": url})[0]
    parent = tracker.mlflow_run_id(pipeline)  # type: ignore[attr-defined]
    with get_runner() as runner:
        handle = runner.run_component(
            "utils.echo", ["--msg", "hi"], "local_cwd", parent_run_id=pipeline, run_name="stage"
        )
        assert runner.wait(handle, timeout=240).state == specs.AppState.SUCCEEDED
    (run,) = job_runs(handle)
    assert run.data.tags["mlflow.parentRunId"] == parent and run.info.run_name == "stage"
    assert run.info.status == "FINISHED"


def cli_run(env: Dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchx.cli.main", "run", "utils.sh", "echo", "hi"],
        capture_output=True, text=True, timeout=240, cwd=cwd, env={**os.environ, **env},
    )  # fmt: skip


def test_a_wrong_password_is_one_line_naming_the_server_and_nothing_is_submitted(
    url: str, tmp_path: Path
) -> None:
    out = cli_run({"MLFLOW_TRACKING_PASSWORD": "not-" + PASSWORD}, tmp_path)
    assert out.returncode == 1 and "hi" not in out.stdout, out
    assert out.stderr.count("\n") == 1 and url in out.stderr and "401" in out.stderr, out.stderr
    assert PASSWORD not in out.stderr
    assert not (tmp_path / "home" / "local_cwd").exists()  # no job was submitted


def test_credentials_in_the_uri_work_and_are_never_shown(
    server: str, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    with_login = server.replace("://", f"://{USER}:{PASSWORD}@")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", with_login)
    out = cli_run({}, tmp_path)
    assert out.returncode == 0, out.stderr
    assert PASSWORD not in out.stdout + out.stderr
    handle = out.stdout.splitlines()[0]  # then its log, as the CLI waits on local jobs
    (run,) = job_runs(handle)
    assert run.info.status == "FINISHED"
    assert PASSWORD not in recorded(run)
    link = build_trackers({"mlflow": with_login})[0].run_url(handle)
    assert link is not None and link.startswith(server + "/#/") and PASSWORD not in link
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", server.replace("://", "://nobody:x@"))
    refused = cli_run({}, tmp_path)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert server in refused.stderr and "nobody:x" not in refused.stderr
