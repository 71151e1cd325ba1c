"""Session-wide test settings.

- ``$TORCHX_HOME`` defaults to a fresh directory per test process, so a run never reads or
  leaves apps in the developer's ``~/.torchx`` and parallel workers never share one.
- Under pytest-xdist (``scripts/test.sh`` runs two workers) a module's tests run on one
  worker, so module fixtures (a reference DAG run, a server) are set up once; and tests
  that share one machine-wide resource run on one worker, one after another: the local
  Slurm cluster (two nodes) and the Ray head (a fixed port, stopped with
  ``ray stop --force``). The scheduler only sees test ids, so such a test carries the
  resource's name as a word of its file or test name (``test_slurm_scheduler.py``,
  ``..._on_slurm``); collection fails on a marked test that does not.
  (xdist's own ``loadgroup`` cannot do this under pytest 9: its group suffix is lost.)
- Modules that share one session fixture started by their first test are one scope too
  (``SHARED_FIXTURES``), so the run starts it once, not once per worker: the Prefect
  server of tests/pipelines/prefect/ (prefect_test_harness, 30-65 s) and the ``mlflow
  server`` of the tracker tests over http.
- The workers get the scopes that take minutes first, longest first (``LONG_SCOPES``), then
  the rest in collection order: a two-worker run lasts at least the latest start of a long
  scope plus its length, so none may start last. (xdist's default order, by test count,
  sent a 2-test, 2-minute module near the end.)
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any, List

import pytest

os.environ["TORCHX_HOME"] = tempfile.mkdtemp(prefix="torchx-test-home-")

# markers whose tests use one shared resource of the machine
SHARED_RESOURCES = ("slurm", "ray")

# files (path prefixes) that share one session fixture: one scope each, named by the fixture
SHARED_FIXTURES = (
    ("tests/pipelines/prefect/", "prefect_server"),
    ("tests/trackers/test_job_run_http.py", "mlflow_http_server"),
    ("tests/trackers/test_run_metrics.py", "mlflow_http_server"),
)

# scopes of a minute or more, longest first: ``python -m pytest -n 1 --durations=40 <dir>``
# per directory on the loaded 2-core machine (2026-11-25), seconds in the comments; the
# Slurm scope's from the suite's own runs (the cluster is up there). A scope not listed
# (renamed, new) runs after these.
LONG_SCOPES = (
    "prefect_server",  # 750: tests/pipelines/prefect/ (test_prefect 484, test_tracking 198)
    "tests/pipelines/kfp/test_kfp.py",  # 565
    "tests/deployments/test_prefect_deployment.py",  # 520 (300 on an idle machine)
    "tests/pipelines/airflow/test_lineage.py",  # 375
    "tests/examples/test_stages.py",  # 307
    "tests/trackers/test_job_run.py",  # 272
    "slurm",  # 250
    "tests/pipelines/kfp/test_kfp_tracking.py",  # 212
    "tests/pipelines/airflow/test_operator.py",  # 190
    "tests/deployments/test_airflow_deployment.py",  # 150
    "tests/cli/test_cli.py",  # 138
    "tests/deployments/test_airflow_orphans.py",  # 120
)


def worker_scope(nodeid: str) -> str:
    """The unit sent to one worker: a shared resource's or fixture's name, else the
    test's file."""
    path, _, name = nodeid.partition("::")
    for prefix, fixture in SHARED_FIXTURES:
        if path.startswith(prefix):
            return fixture
    words = set(re.split(r"[^a-z0-9]+", (os.path.basename(path) + " " + name).lower()))
    for resource in SHARED_RESOURCES:
        if resource in words:
            return resource
    return path


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    # long scopes first, longest first (a stable sort: the rest keep collection order)
    rank = {scope: i for i, scope in enumerate(LONG_SCOPES)}
    items.sort(key=lambda item: rank.get(worker_scope(item.nodeid), len(LONG_SCOPES)))
    for item in items:
        for resource in SHARED_RESOURCES:
            if item.get_closest_marker(resource) and worker_scope(item.nodeid) != resource:
                raise pytest.UsageError(
                    f"{item.nodeid} is marked {resource} but its file or test name lacks the"
                    f" word {resource!r}: rename it so parallel runs keep it on one worker"
                )


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class SharedResourceScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_scope(nodeid)

    # keep the collection order above (xdist would reorder scopes by their number of tests)
    config.option.loadscopereorder = False
    return SharedResourceScheduling(config, log)
