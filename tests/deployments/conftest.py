"""One Airflow deployment for test_airflow_deployment.py and test_airflow_orphans.py.

A deployment takes 15-20 s to start and its four processes keep a CPU busy while they
run, so the two modules share one with both modules' DAGs: they are one scope
(``tests/conftest.py``), and the deployment stops after this package's last test on the
worker that runs them.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.deployments.airflow_deployment import AirflowDeployment, airflow_deployment


@pytest.fixture(scope="package")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowDeployment]:
    from tests.deployments.test_airflow_deployment import DAGS as STAGE_DAGS
    from tests.deployments.test_airflow_orphans import DAGS as ORPHAN_DAGS

    work = tmp_path_factory.mktemp("airflow-deployment")
    dags = work / "dags"
    dags.mkdir()
    (dags / "torchx_dags.py").write_text(STAGE_DAGS)
    (dags / "orphan_dags.py").write_text(ORPHAN_DAGS)
    torchx_env = {"TORCHX_HOME": str(work / "torchx_home"), "TORCHX_TRACKERS": ""}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in torchx_env.items():  # this process counts the deployment's apps
            mp.setenv(k, v)
        with airflow_deployment(work, dags, torchx_env) as deployment:
            yield deployment
