"""What a flow run records per stage, and how the cancel hook reaches an app with it from a
process whose ``TORCHX_HOME`` differs (as Prefect's worker, which runs the hook)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

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
