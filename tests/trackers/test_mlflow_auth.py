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
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from tests.mlflow_server import counting_proxy, mlflow_server
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


def three_stage_pipeline(url: str) -> Tuple[str, str, str, str]:
    """A pipeline run and its prep -> train -> eval stages, written as stages write them."""
    tag = os.urandom(4).hex()
    pipeline = f"airflow://dag/{tag}-run"
    prep, train, ev = (f"local_cwd://torchx/{tag}-{s}" for s in ("prep", "train", "eval"))
    open_pipeline_run(pipeline, {"mlflow": url}, orchestrator="airflow")
    tracker = build_trackers({"mlflow": url})[0]
    for stage in (prep, train, ev):
        tracker.set_parent(stage, pipeline)
    tracker.add_artifact(prep, "dataset", "/data", {"digest": "d1"})
    tracker.add_source(train, prep, "dataset")
    tracker.add_artifact(train, "model", "/model")
    tracker.add_source(ev, train, "model")
    tracker.add_source(ev, prep, "dataset")
    return pipeline, prep, train, ev


# requests for the lineage of a 3-stage pipeline: the experiments, the pipeline run, its
# stages, then each stage's consumers (was 50-odd: a few per run and edge)
LINEAGE_REQUESTS = 6


def test_a_pipelines_lineage_takes_a_handful_of_requests(url: str) -> None:
    pipeline, prep, train, ev = three_stage_pipeline(url)
    with counting_proxy(url) as (proxy, seen):
        lineage = build_trackers({"mlflow": proxy})[0].pipeline_lineage(pipeline)
        assert len(seen) <= LINEAGE_REQUESTS, seen
    assert sorted(lineage.stages) == sorted([prep, train, ev])
    edges = {(e.source, e.target, e.artifact) for e in lineage.edges}
    assert edges == {(prep, train, "dataset"), (train, ev, "model"), (prep, ev, "dataset")}
    assert sorted(lineage.runs) == sorted([pipeline, prep, train, ev])
    assert lineage.runs[pipeline]["kind"] == "pipeline"
    assert lineage.runs[prep]["torchx.parent_run_id"] == pipeline

    with counting_proxy(url) as (proxy, seen):  # the CLI: a health check more
        out = tracker_cli(proxy, "lineage", pipeline)
        assert len(seen) <= LINEAGE_REQUESTS + 1, seen
    assert out.returncode == 0, out.stderr
    assert f"stage {train}" in out.stdout and f"<- dataset <- {prep}" in out.stdout


def tracker_cli(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchx.cli.main", "tracker", "--tracker", f"mlflow={url}", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_run_is_named_by_a_unique_prefix_and_an_ambiguous_one_names_the_candidates(
    url: str,
) -> None:
    pipeline, prep, train, ev = three_stage_pipeline(url)
    tag = pipeline.rpartition("/")[2][:8]
    tracker = build_trackers({"mlflow": url})[0]
    mlflow_id = tracker.mlflow_run_id(train)  # type: ignore[attr-defined]
    named = {pipeline[:-2]: pipeline, f"{tag}-pr": prep, mlflow_id[:10]: train}
    for prefix, run in named.items():  # of a handle, of an app id, of an MLflow run id
        out = tracker_cli(url, "lineage", prefix)
        assert out.returncode == 0, (prefix, out.stderr)
        assert out.stdout.split("\n")[0].split(" [")[0] == run, (prefix, out.stdout)
        assert f"dataset -> {train}" in out.stdout or f"<- dataset <- {prep}" in out.stdout
    out = tracker_cli(url, "list", "metadata", f"{tag}-ev")
    assert out.returncode == 0 and ev in out.stdout, out

    out = tracker_cli(url, "lineage", f"local_cwd://torchx/{tag}-")
    assert out.returncode == 1 and out.stdout == "", out
    assert out.stderr.count("\n") == 1 and all(j in out.stderr for j in (prep, train, ev)), out
    out = tracker_cli(url, "list", "artifacts", f"{tag}-")  # app ids
    assert out.returncode == 1 and all(j in out.stderr for j in (prep, train, ev)), out.stderr
    out = tracker_cli(url, "lineage", f"nothing-{tag}")
    assert out.returncode == 1 and f"no tracked run 'nothing-{tag}'" in out.stderr, out.stderr
