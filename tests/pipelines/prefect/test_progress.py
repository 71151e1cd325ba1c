"""Progress reports and stall detection of torchx stages in a real Prefect flow run (a
temporary Prefect server, real local_cwd jobs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pipelines.prefect.reads import flow_run_artifacts, flow_run_logs

PROGRESS = (
    "import time; from torchx.trackers import report_progress\n"
    "for i in range(1, 11):\n"
    "    report_progress(i, total=10, loss=1.0 / i); time.sleep(0.5)"
)


@pytest.fixture()
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_server: None) -> Path:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "")
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_stage_reporting_progress_has_a_progress_artifact(env: Path) -> None:
    from prefect import flow

    from torchx.pipelines.prefect import run

    @flow
    def training() -> str:
        return run("utils.python", ["--c", PROGRESS], key="train", progress_interval=0.5)

    state = training(return_state=True)
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    # the artifact belongs to the flow run (created in the stage's task run context)
    artifacts = flow_run_artifacts(flow_run_id)
    assert artifacts.get("torchx-progress-train") == 100.0, artifacts
    needle = "progress: step 10/10"
    messages = flow_run_logs(flow_run_id, needle)
    assert any(m.startswith(needle) and "loss=0.1" in m for m in messages), messages


def test_a_stalled_stage_fails_with_the_reason(env: Path) -> None:
    from prefect import flow

    from torchx.pipelines.prefect import TorchXJobFailed, run

    code = (
        "import time; from torchx.trackers import report_progress\n"
        "report_progress(1, total=10); time.sleep(300)"
    )

    @flow
    def stalling() -> str:
        return run("utils.python", ["--c", code], key="stuck", stall_timeout=5)

    state = stalling(return_state=True)
    with pytest.raises(TorchXJobFailed, match=r"stalled: no progress or output for 5 s") as e:
        state.result()
    assert e.value.status is not None and str(e.value.status.state) == "FAILED"
