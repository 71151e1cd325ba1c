"""One Airflow home (sqlite, migrated once) for the whole test session.

Set before airflow is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

_HOME = Path(tempfile.mkdtemp(prefix="torchx-airflow-"))
os.environ["AIRFLOW_HOME"] = str(_HOME / "airflow")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(_HOME / "dags")
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    (_HOME / "dags").mkdir(exist_ok=True)
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    subprocess.run([airflow, "db", "migrate"], check=True, capture_output=True, timeout=300)
    return _HOME


@pytest.fixture()
def torchx_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_db: Path) -> Path:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHX_TRACKERS", "mlflow")
    monkeypatch.setenv("TORCHX_TRACKER_MLFLOW_CONFIG", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    return tmp_path
