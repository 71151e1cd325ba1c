"""One temporary Prefect server for the session (prefect_test_harness), isolated from ~/.prefect."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

_HOME = tempfile.mkdtemp(prefix="torchx-prefect-")
os.environ["PREFECT_HOME"] = _HOME
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_MEMO_STORE_PATH"] = os.path.join(_HOME, "memo_store.toml")
os.environ.setdefault("PREFECT_LOGGING_TO_API_BATCH_INTERVAL", "0.3")


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[None]:
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=300):
        yield


@pytest.fixture()
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_server: None) -> Path:
    """A test's own torchx home and MLflow sqlite store, in its own working directory."""
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path
