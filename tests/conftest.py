"""Session-wide test settings.

- ``$TORCHX_HOME`` defaults to a fresh directory per test process, so a run never reads or
  leaves apps in the developer's ``~/.torchx`` and parallel workers never share one.
- Under pytest-xdist (``-n 2 --dist loadgroup``, as ``scripts/test.sh`` runs), a module's
  tests run on one worker (its module fixtures, such as a reference DAG run or a server,
  are set up once), and tests that share one machine-wide resource run on one worker, one
  after another: the local Slurm cluster (two nodes) and the Ray head (a fixed port,
  stopped with ``ray stop --force``).
"""

from __future__ import annotations

import os
import tempfile
from typing import List

import pytest

os.environ["TORCHX_HOME"] = tempfile.mkdtemp(prefix="torchx-test-home-")

# markers whose tests use one shared resource of the machine
SHARED_RESOURCES = ("slurm", "ray")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    for item in items:
        group = item.nodeid.split("::", 1)[0]
        for resource in SHARED_RESOURCES:
            if item.get_closest_marker(resource) is not None:
                group = resource
                break
        item.add_marker(pytest.mark.xdist_group(group))
