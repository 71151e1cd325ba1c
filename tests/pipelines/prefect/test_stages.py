"""What a flow run records per stage, and how the cancel hook reaches an app with it from a
process whose ``TORCHX_HOME`` differs (as Prefect's worker, which runs the hook)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from uuid import UUID

import pytest

from tests.polling import poll
from torchx.components.utils import sh
from torchx.pipelines.prefect import stages
from torchx.runner import get_runner


def test_a_stage_record_keeps_the_home_and_no_tracker_password() -> None:
    record = stages.here(
        "local_cwd",
        "prefect/f/train",
        {"mlflow": "https://me:secret@mlflow:5000/x", "fsspec": None},
    )
    assert record.torchx_home == os.environ["TORCHX_HOME"]
    assert record.trackers == {"mlflow": "https://mlflow:5000/x", "fsspec": None}
    assert "secret" not in record.where()


def test_cancel_stages_reaches_an_app_under_another_torchx_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The app lives under the flow run's TORCHX_HOME, not this process's: the hook cancels
    it in a child process with the recorded home, and says so in the log it was given."""
    home, key = str(tmp_path / "flow-run-home"), "prefect/flow-run/sleeper"
    with monkeypatch.context() as m:
        m.setenv("TORCHX_HOME", home)
        with get_runner(trackers={}) as runner:
            handle = runner.run(sh("sleep", "600"), "local_cwd", idempotency_key=key)
        record = stages.here("local_cwd", key, {})
    assert record.torchx_home == home != os.environ["TORCHX_HOME"]
    try:
        with caplog.at_level(logging.INFO):
            stages.cancel_stages([record], "", logging.getLogger("hook"), {})
        assert f"cancelling {handle}" in caplog.text, caplog.text
        with monkeypatch.context() as m:
            m.setenv("TORCHX_HOME", home)
            with get_runner(trackers={}) as runner:
                status = poll(lambda: runner.status(handle), what=handle)
        assert status.state.name == "CANCELLED"
    finally:
        with monkeypatch.context() as m:
            m.setenv("TORCHX_HOME", home)
            with get_runner(trackers={}) as runner:
                runner.cancel(handle)


def test_a_flow_run_holds_one_record_per_stage_the_latest_kept(prefect_server: None) -> None:
    """Two stages, the first recorded again (a retry, now under another home): two records,
    the retry's settings kept. A label recorded by torchx 0.8.0.dev0 is still read."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    train = stages.here("local_cwd", "prefect/f/train", {})

    @flow
    def two_stages() -> str:
        stages.record_stage(flow_run.id, train)
        stages.record_stage(flow_run.id, stages.here("local_cwd", "prefect/f/eval", {}))
        return str(flow_run.id)

    flow_run_id = two_stages()
    retried = stages.StageRecord("local_cwd", "prefect/f/train", "/elsewhere")
    stages.record_stage(flow_run_id, retried)
    by_key = {r.key: r for r in stages.read_stages(flow_run_id)}
    assert set(by_key) == {"prefect/f/train", "prefect/f/eval"}
    assert by_key["prefect/f/train"] == retried != train

    old = stages.StageRecord("local_cwd", "prefect/f/old", "/old-home")
    with get_client(sync_client=True) as client:
        label = {stages.LABEL_PREFIX + "0123abcd": json.dumps(asdict(old))}
        client.update_flow_run_labels(UUID(flow_run_id), label)
    assert old in stages.read_stages(flow_run_id)
