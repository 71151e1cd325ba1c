"""Resource-hours of a 2-stage Prefect pipeline (a temporary Prefect server, real local_cwd
jobs, a real gloo ``dist.ddp -j 1x2`` stage, real MLflow on sqlite): each stage's run has
its ``cpu_hours`` / ``gpu_hours`` and the pipeline run, closed by the flow's hook, their
sums."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest

from tests.trackers.test_run_metrics import DDP, assert_hours_match_the_run
from torchx.runner.resource_hours import CPU_HOURS, GPU_HOURS

FLOW = "hours-pipeline"


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_server: None) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", uri)
    for var in ("TORCHX_PARENT_RUN_ID", "TORCHX_JOB_ID", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(DDP)
    return uri


def _runs(uri: str, flt: str) -> Dict[str, Any]:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    return {r.info.run_name: r for r in client.search_runs(exps, filter_string=flt)}


def test_the_pipeline_run_has_the_sum_of_its_stages_resource_hours(store: str) -> None:
    from prefect import flow

    from torchx.pipelines.prefect import close_pipeline_run, run

    @flow(name=FLOW, on_completion=[close_pipeline_run], on_failure=[close_pipeline_run])
    def pipeline() -> Dict[str, str]:
        train = run("dist.ddp", ["-j", "1x2", "--script", "train.py"], key="train")
        report = run("utils.sh", ["echo", "trained"], key="report")
        return {"train": train, "report": report}

    state = pipeline(return_state=True)
    assert state.is_completed(), state
    fid = state.state_details.flow_run_id
    (parent,) = _runs(store, f"tags.`torchx.job_id` = 'prefect://{FLOW}/{fid}'").values()
    assert parent.info.status == "FINISHED"
    stages = _runs(store, f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted(stages) == ["report", "train"]
    for run_ in stages.values():
        assert run_.info.status == "FINISHED" and run_.data.metrics[CPU_HOURS] > 0
        assert run_.data.metrics[GPU_HOURS] == 0
        assert_hours_match_the_run(run_)
    for key in (CPU_HOURS, GPU_HOURS):
        total = sum(r.data.metrics[key] for r in stages.values())
        assert parent.data.metrics[key] == pytest.approx(total, rel=1e-9, abs=1e-12)
