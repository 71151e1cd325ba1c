"""Prefect 3 integration against a real (temporary) Prefect server and real local_cwd jobs."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture()
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_server: None) -> Path:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


async def _artifact_keys() -> list:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        return [a.key for a in await client.read_artifacts()]


@pytest.mark.slow
def test_reference_flow_completes_with_lineage_and_artifacts(env: Path) -> None:
    sys.path.insert(0, str(ROOT / "examples" / "pipelines" / "prefect"))
    from reference_flow import reference_flow

    result = reference_flow(base_dir=str(env / "out"), j="1x2", epochs=3, limit=500)
    assert result["test_accuracy"] > 0.3
    from torchx.trackers.api import build_trackers

    tracker = build_trackers({"mlflow": os.environ["TORCHX_TRACKER_MLFLOW_CONFIG"]})[0]
    pipeline = [r for r in tracker.run_ids() if r.startswith("prefect://torchx-reference/")]
    assert len(pipeline) == 1
    assert sorted(tracker.run_ids(parent_run_id=pipeline[0])) == sorted([result["datapreproc"], result["train"], result["evaluate"]])
    ev = result["evaluate"]
    assert {e.artifact for e in tracker.lineage(ev).upstream(ev)} == {"model", "dataset"}
    keys = asyncio.run(_artifact_keys())
    assert any(k and k.startswith("torchx-replicas-train") for k in keys), keys
    assert any(k and k.startswith("torchx-logs-evaluate") for k in keys), keys
    assert any(k and k.startswith("torchx-mlflow-train") for k in keys), keys


def test_failing_stage_fails_the_flow_with_the_workers_error(env: Path, caplog: pytest.LogCaptureFixture) -> None:
    from prefect import flow

    from torchx.pipelines.prefect import TorchXJobFailed, submit, wait

    @flow
    def failing() -> None:
        wait(submit("utils.python", ["--c", "raise RuntimeError('loss is nan')"]))

    with pytest.raises(TorchXJobFailed, match="RuntimeError: loss is nan") as e:
        failing()
    assert e.value.status is not None and str(e.value.status.state) == "FAILED"
    assert "python/0 RuntimeError: loss is nan" in caplog.text  # streamed into the task log


def test_submit_is_idempotent_per_flow_run_and_key(env: Path) -> None:
    from prefect import flow

    from torchx.pipelines.prefect import submit, wait
    from torchx.runner import get_runner

    @flow
    def twice() -> tuple:
        first = submit("utils.sh", ["sleep", "1"], key="stage")
        again = submit("utils.sh", ["sleep", "1"], key="stage")  # what a retry of the task does
        wait(again)
        return first, again

    first, again = twice()
    assert first == again
    with get_runner() as runner:
        assert len(runner.list("local_cwd")) == 1


def test_timeout_of_the_flow_cancels_the_app(env: Path) -> None:
    from prefect import flow

    from torchx.pipelines.prefect import submit, wait

    handles: list = []

    @flow(timeout_seconds=4)
    def slow() -> None:
        h = submit("utils.sh", ["--num_replicas", "2", "sleep", "600"])
        handles.append(h)
        wait(h)

    with pytest.raises(BaseException):  # noqa: B017 (Prefect's timeout error type varies by version)
        slow()
    from torchx.runner import get_runner

    with get_runner() as runner:
        status = runner.wait(handles[0], timeout=60)
    assert str(status.state) == "CANCELLED"
    time.sleep(0.5)
    sleeps = [p for p in psutil.process_iter(["cmdline", "environ"]) if p.info["cmdline"] == ["sleep", "600"]
              and (p.info["environ"] or {}).get("TORCHX_JOB_ID") == handles[0]]
    assert sleeps == []


def test_job_block_trigger_wait_fetch_and_save(env: Path) -> None:
    from torchx.pipelines.prefect import TorchXJob, TorchXJobFailed

    async def go() -> dict:
        job = TorchXJob(component="utils.echo", component_args=["--msg", "block"])
        await job.save("torchx-echo", overwrite=True)
        loaded = await TorchXJob.load("torchx-echo")
        run = await loaded.trigger()
        await run.wait_for_completion()
        return await run.fetch_result()

    result = asyncio.run(go())
    assert result["state"] == "SUCCEEDED" and result["app_handle"].startswith("local_cwd://")

    async def failing() -> None:
        run = await TorchXJob(component="utils.sh", component_args=["false"]).trigger()
        await run.wait_for_completion()
        await run.fetch_result()

    with pytest.raises(TorchXJobFailed):
        asyncio.run(failing())
    assert "component" in TorchXJob.model_json_schema()["properties"]
