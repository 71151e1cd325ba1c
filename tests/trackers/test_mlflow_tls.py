"""Tracking into an MLflow server behind TLS with a self-signed certificate: one real
``mlflow server`` over https for the module, real local_cwd jobs. The submitter and the
job's ranks trust it by MLflow's ``MLFLOW_TRACKING_SERVER_CERT_PATH`` or skip the check by
``MLFLOW_TRACKING_INSECURE_TLS``; with neither, submitting is one line."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import Iterator, Tuple

import pytest

from tests.mlflow_server import mlflow_server
from torchx import specs
from torchx.runner import get_runner
from torchx.trackers.api import TrackerConfigError, build_trackers

# a rank's own calls (a tag and a metric on the job's run) go to the server too
RANK = textwrap.dedent("""
    from torchx.tracker import app_run_from_env
    app_run_from_env().add_metadata(stage="tls")
    app_run_from_env().log_metrics({"loss": 0.5}, step=1)
""")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[str, Path]]:
    directory = tmp_path_factory.mktemp("mlflow_tls")
    with mlflow_server(directory, tls=True) as url:
        yield url, directory / "cert.pem"


@pytest.fixture()
def url(server: Tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", server[0])
    for var in ("TORCHX_PARENT_RUN_ID", "TORCHX_JOB_ID", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    for var in ("MLFLOW_TRACKING_INSECURE_TLS", "MLFLOW_TRACKING_SERVER_CERT_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return server[0]


def run_tracked_job(url: str) -> None:
    """A job whose rank records into its run; the run is read back through torchx."""
    app = specs.AppDef("tls", [specs.Role("w", ".", entrypoint=sys.executable, args=["-c", RANK])])
    with get_runner() as runner:
        handle = runner.run(app, "local_cwd")
        assert runner.wait(handle, timeout=240).state == specs.AppState.SUCCEEDED
    tracker = build_trackers({"mlflow": url})[0]
    assert tracker.metadata(handle)["stage"] == "tls"
    run_id = tracker.mlflow_run_id(handle)  # type: ignore[attr-defined]
    status = tracker.store.run_info(run_id)  # type: ignore[attr-defined]
    assert status is not None and status[1] == "FINISHED"


def test_a_ca_certificate_path_trusts_the_server(
    url: str, server: Tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_SERVER_CERT_PATH", str(server[1]))
    run_tracked_job(url)


def test_insecure_tls_skips_the_check(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_INSECURE_TLS", "true")
    run_tracked_job(url)


def test_an_untrusted_server_is_one_line_and_nothing_runs(url: str) -> None:
    app = specs.AppDef("x", [specs.Role("w", ".", entrypoint="true")])
    with get_runner() as runner, pytest.raises(TrackerConfigError) as e:
        runner.run(app, "local_cwd")
    message = str(e.value)
    assert "\n" not in message and url in message, message
    assert "MLFLOW_TRACKING_SERVER_CERT_PATH" in message, message
    assert not (Path(os.environ["TORCHX_HOME"]) / "local_cwd").exists()
