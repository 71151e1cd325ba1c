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


def worker_scope(nodeid: str) -> str:
    """The unit sent to one worker: a shared resource's name, else the test's file."""
    path, _, name = nodeid.partition("::")
    words = set(re.split(r"[^a-z0-9]+", (os.path.basename(path) + " " + name).lower()))
    for resource in SHARED_RESOURCES:
        if resource in words:
            return resource
    return path


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    # the long serial scopes first, so the other worker runs the rest meanwhile
    items.sort(key=lambda item: worker_scope(item.nodeid) not in SHARED_RESOURCES)
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

    return SharedResourceScheduling(config, log)
