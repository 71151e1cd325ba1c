"""Tasks and the ``TorchXJob`` block side by side in one real flow run, tracked by a real
``mlflow server`` on loopback: runs, params, nesting, http links, artifacts, names, logs.

The flow is the user's own 3-stage pipeline of the examples (``my_pipeline.py``: plain
programs, no tracker calls); one flow run of it serves every test of the module.
"""

from __future__ import annotations

import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from prefect import flow
from prefect.utilities.asyncutils import run_coro_as_sync

from tests.mlflow_server import mlflow_server
from tests.pipelines.prefect.reads import flow_run_artifacts, flow_run_logs, flow_run_task_runs
from tests.polling import poll_until
from torchx.pipelines.prefect import TorchXJob

ROOT = Path(__file__).resolve().parents[3]
FLOW = "my-pipeline"
STAGES = ["prep", "train", "report"]


@dataclass
class Tracked:
    url: str
    workdir: Path
    flow_run_id: str
    handles: Dict[str, str]


@pytest.fixture(scope="module")
def tracked(prefect_server: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tracked]:
    tmp = tmp_path_factory.mktemp("tracked")
    with mlflow_server(tmp / "mlflow") as url, pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHX_HOME", str(tmp / "home"))
        mp.setenv("TORCHX_TRACKERS", "mlflow")
        mp.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", url)
        mp.delenv("TORCHX_MLFLOW_UI_URL", raising=False)
        mp.delenv("TORCHXCONFIG", raising=False)
        mp.chdir(tmp)
        sys.path.insert(0, str(ROOT / "examples" / "pipelines" / "prefect"))
        from my_pipeline import my_pipeline

        work = tmp / "work"
        work.mkdir()
        state = my_pipeline(str(work), greeting="hello-stages", return_state=True)
        handles = state.result()
        yield Tracked(url, work, str(state.state_details.flow_run_id), handles)


def _client(url: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=url)


def _runs(url: str, flt: str) -> List[Any]:
    client = _client(url)
    exps = [e.experiment_id for e in client.search_experiments()]
    return list(client.search_runs(exps, filter_string=flt)) if exps else []


def _pipeline_run(t: Tracked) -> Any:
    runs = _runs(t.url, f"tags.`torchx.job_id` = 'prefect://{FLOW}/{t.flow_run_id}'")
    assert len(runs) == 1, runs
    return runs[0]


def _stage_runs(t: Tracked) -> Dict[str, Any]:
    """The stage runs under the pipeline run, by run name, once all three ended."""
    parent = _pipeline_run(t).info.run_id

    def fetch() -> Dict[str, Any]:
        runs = _runs(t.url, f"tags.`mlflow.parentRunId` = '{parent}'")
        return {r.info.run_name: r for r in runs}

    return poll_until(
        fetch, lambda rs: all(r.info.status != "RUNNING" for r in rs.values()), every=0.3
    )


def test_each_stage_has_a_finished_run_with_params_under_the_finished_pipeline_run(
    tracked: Tracked,
) -> None:
    pipeline = poll_until(
        lambda: _pipeline_run(tracked), lambda r: r.info.status != "RUNNING", every=0.3
    )
    assert pipeline.info.status == "FINISHED"
    runs = _stage_runs(tracked)
    assert sorted(runs) == sorted(STAGES)  # named after the stage, not the app handle
    for name, r in runs.items():
        assert r.info.status == "FINISHED", (name, r.info.status)
        assert r.data.tags["torchx.job_id"] == tracked.handles[name]
        params = r.data.params
        assert params["prefect.flow"] == FLOW
        assert params["prefect.flow_run_id"] == tracked.flow_run_id
        assert params["prefect.task"] == name
        assert params["prefect.param.greeting"] == "hello-stages"
        assert params["scheduler"] == "local_cwd"
    assert (tracked.workdir / "model.txt").read_text().strip() == "13"  # len("hello-stages\n")
    assert runs["prep"].data.params["prefect.param.workdir"] == str(tracked.workdir)
    assert runs["prep"].data.params["component"] == "utils.sh"
    assert runs["report"].data.params["component"] == "utils.echo"
    assert "model written to" in runs["report"].data.params["args"]  # the block's dict args


def test_mlflow_link_artifacts_are_http_urls_of_the_server_under_stable_keys(
    tracked: Tracked,
) -> None:
    runs = _stage_runs(tracked)
    artifacts = flow_run_artifacts(tracked.flow_run_id)
    for name in STAGES:  # the tasks' stages and the block's alike; no app id in the keys
        assert f"torchx-replicas-{name}" in artifacts, sorted(artifacts)
        r = runs[name].info
        url = f"{tracked.url}/#/experiments/{r.experiment_id}/runs/{r.run_id}"
        link = artifacts.get(f"torchx-mlflow-{name}")
        assert link is not None and link.endswith(f"]({url})"), (name, link)
    with urllib.request.urlopen(tracked.url, timeout=10) as page:  # a real UI answers
        assert page.status == 200 and b"<html" in page.read().lower()


def test_task_runs_are_named_after_their_keys(tracked: Tracked) -> None:
    names = [t.name for t in flow_run_task_runs(tracked.flow_run_id)]
    assert sorted(names) == ["prep", "submit-train", "wait-train"]


def test_the_block_and_the_tasks_stream_the_replicas_logs_into_the_flow_run(
    tracked: Tracked,
) -> None:
    needle = f"echo/0 model written to {tracked.workdir}/model.txt"
    logged = flow_run_logs(tracked.flow_run_id, needle)
    assert needle in logged  # the block
    assert "sh/0 hello-stages" in logged  # the run task


def test_without_a_ui_there_is_no_link_artifact_and_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_server: None, caplog: Any
) -> None:
    """An embedded sqlite store has no UI: the stage runs are tracked, nothing links."""
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("TORCHX_MLFLOW_UI_URL", raising=False)
    monkeypatch.chdir(tmp_path)

    @flow
    def no_ui() -> Optional[str]:
        job = TorchXJob(component="utils.sh", component_args=["echo", "no-ui"], key="solo")
        job_run = run_coro_as_sync(job.trigger())
        run_coro_as_sync(job_run.wait_for_completion())
        return job_run.handle

    state = no_ui(return_state=True)
    assert state.is_completed()
    artifacts = flow_run_artifacts(state.state_details.flow_run_id)
    assert "torchx-replicas-solo" in artifacts and "torchx-mlflow-solo" not in artifacts
    problems = [
        r
        for r in caplog.records
        if r.name.startswith("torchx")
        and r.levelname
        in (
            "WARNING",
            "ERROR",
        )
    ]
    assert problems == [], [r.getMessage() for r in problems]
