"""A real ``mlflow server`` shared by the tracker tests over http (test_job_run_http.py and
test_run_metrics.py, one xdist scope: see tests/conftest.py), so a run starts it once.

Each test finds its runs by its own job id (``torchx.job_id`` tag), so other tests' runs in
the same store change nothing it reads.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.mlflow_server import mlflow_server


@pytest.fixture(scope="session")
def mlflow_http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with mlflow_server(tmp_path_factory.mktemp("mlflow_http")) as url:
        yield url
