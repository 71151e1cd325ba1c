"""One Airflow home (sqlite, migrated once) for the whole test session, with OpenLineage
writing its events to one file through the real client's file transport.

Set before airflow is imported: the OpenLineage plugin decides once per process whether
it is enabled.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.airflow_db import copy_migrated_db

_HOME = Path(tempfile.mkdtemp(prefix="torchx-airflow-"))
OPENLINEAGE_EVENTS = _HOME / "openlineage.jsonl"
os.environ["AIRFLOW_HOME"] = str(_HOME / "airflow")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(_HOME / "dags")
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
os.environ["AIRFLOW__OPENLINEAGE__NAMESPACE"] = "torchx-tests"
os.environ["AIRFLOW__OPENLINEAGE__TRANSPORT"] = json.dumps(
    {"type": "file", "log_file_path": str(OPENLINEAGE_EVENTS), "append": True}
)
# emit from a thread of the task's process rather than a fork of the test process
os.environ["AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD"] = "True"


@pytest.fixture(scope="session")
def airflow_db() -> Iterator[Path]:
    (_HOME / "dags").mkdir(exist_ok=True)
    copy_migrated_db(_HOME / "airflow" / "airflow.db")  # AIRFLOW_HOME's default database
    yield _HOME
    # A DAG run's state change (in dag.test, in this process) starts the OpenLineage
    # listener's process pool (forked workers). An xdist worker exits without atexit, so
    # its pool workers would outlive the run, blocked on their queue (and holding the
    # run's output pipe): stop the pool as Airflow does for its own components.
    from airflow.providers.openlineage.plugins.listener import get_openlineage_listener

    get_openlineage_listener().before_stopping(component=None)


@pytest.fixture()
def torchx_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_db: Path) -> Path:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    return tmp_path
