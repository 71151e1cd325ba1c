"""Session-wide test settings.

- ``$TORCHX_HOME`` defaults to a fresh directory per test process, so a run never reads or
  leaves apps in the developer's ``~/.torchx`` and parallel workers never share one.
- Under pytest-xdist (``scripts/test.sh`` runs five workers) a module's tests run on one
  worker, so module fixtures (a reference DAG run, a server) are set up once; and tests
  that share one machine-wide resource run on one worker, one after another: the local
  Slurm cluster (two nodes) and the Ray head of tests/schedulers/ray (one start for its
  modules). The scheduler only sees test ids, so such a test carries the
  resource's name as a word of its file or test name (``test_slurm_scheduler.py``,
  ``..._on_slurm``); collection fails on a marked test that does not.
  (xdist's own ``loadgroup`` cannot do this under pytest 9: its group suffix is lost.)
- Modules that share one session fixture started by their first test are one scope too
  (``SHARED_FIXTURES``), so the run starts it once, not once per worker: the Prefect
  server of tests/pipelines/prefect/ (prefect_test_harness, 30-65 s) and the ``mlflow
  server`` of the tracker tests over http.
- The workers get the scopes that take minutes first, longest first (``LONG_SCOPES``), then
  the rest in collection order: a run lasts at least the latest start of a long scope plus
  its length, so none may start last. (xdist's default order, by test count, sent a 2-test,
  2-minute module near the end.)
- Half the suite's time is waiting (a Slurm job, a stall timeout). With three workers, the
  first runs the scopes that mostly wait (``WAITING_SCOPES``), with four or more the first
  two, and the others the rest, so the waits overlap the work without more work contending for the
  2 CPUs.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from typing import Any, List

import pytest

os.environ["TORCHX_HOME"] = tempfile.mkdtemp(prefix="torchx-test-home-")
# keep the test modules' assertion-rewritten bytecode between runs, even where
# PYTHONDONTWRITEBYTECODE is set (it is on the CI machines): rewriting every module again
# cost each worker 1.8 s of CPU; the processes the tests start keep the setting
sys.dont_write_bytecode = False

# markers whose tests use one shared resource of the machine
SHARED_RESOURCES = ("slurm", "ray")

# files (path prefixes) that share one session fixture: one scope each, named by the fixture
SHARED_FIXTURES = (
    ("tests/pipelines/prefect/", "prefect_server"),
    ("tests/trackers/test_job_run_http.py", "mlflow_http_server"),
    ("tests/trackers/test_run_metrics.py", "mlflow_http_server"),
)

# scopes of a minute or more, longest first: the sum of their tests' durations in a
# two-worker run of the suite (2026-11-26, ``--durations=0``), seconds in the comments. A
# scope not listed (renamed, new) runs after these.
LONG_SCOPES = (
    "slurm",  # 182
    "ray",  # 147
    "tests/schedulers/ray/test_remote_head.py",  # 100-170 (its own head; + its venv once)
    "prefect_server",  # 133: tests/pipelines/prefect/
    "tests/pipelines/kfp/test_kfp_containers.py",  # 138 alone at a load of 10 (DockerRunner)
    "tests/deployments/test_airflow_orphans.py",  # 82 (early: its 90 s promises want a calm CPU)
    "tests/examples/test_stages.py",  # 98
    "tests/deployments/test_airflow_deployment.py",  # 92
    "mlflow_http_server",  # 91
    "tests/deployments/test_prefect_deployment.py",  # 89
    "tests/pipelines/airflow/test_lineage.py",  # 49
    "tests/pipelines/kfp/test_kfp.py",  # 46
    "tests/pipelines/airflow/test_operator.py",  # 41
    "tests/trackers/test_mlflow.py",  # 39
    # issue 37: an mlflow server each (basic-auth; https), one worker, load 12 (2026-11-27)
    "tests/trackers/test_mlflow_auth.py",  # 38
    "tests/trackers/test_mlflow_tls.py",  # 32
    # 2026-11-27, four workers: these two, started last, made the run's last 28 s
    "tests/pipelines/kfp/test_kfp_tracking.py",  # 30
    "tests/trackers/test_job_run.py",  # 28
    # 2026-11-27: real containers (a DDP job across two), about a minute
    "tests/schedulers/docker/test_docker_scheduler.py",
)

# scopes that mostly wait (on Slurm, Ray, a server, a stall timeout: under a fifth of their
# time on a CPU, in this process and its children): with three workers or more, one runs
# them while the others run the scopes that keep the machine's CPUs busy
WAITING_SCOPES = (
    "slurm",  # 12 s of CPU in 182 s
    "ray",  # 22 in 147
    "tests/schedulers/ray/test_remote_head.py",  # waits on its head's jobs
    "mlflow_http_server",  # 10 in 91
    "tests/schedulers/test_aws_batch_stall.py",  # 2 in 18
    "tests/cli/test_progress_cli.py",  # 1 in 14
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

        def _assign_work_unit(self, node: Any) -> None:
            """The first worker (two of four or more) takes the waiting scopes, the others
            the rest, each in queue order; a worker takes the other kind once its own is
            done."""
            if len(self.nodes) >= 3:  # 3 workers: one waits; 4 or more: two wait
                waits = node.gateway.id in ("gw0", "gw1")[: len(self.nodes) - 2]
                mine = [s for s in self.workqueue if (s in WAITING_SCOPES) == waits]
                if mine:
                    self.workqueue.move_to_end(mine[0], last=False)
            super()._assign_work_unit(node)

    # keep the collection order above (xdist would reorder scopes by their number of tests)
    config.option.loadscopereorder = False
    return SharedResourceScheduling(config, log)
