"""The Ray tests' one local Ray head (loopback only, free ports, ``head.ray_head``),
started for the first test of this package that asks for it and stopped after its last: the
scheduler and stall modules use it, and one start (20-30 s on a loaded machine) is enough.
Those tests run on one worker (tests/conftest.py). Its jobs run with this venv's Python."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.schedulers.ray.head import answers
from tests.schedulers.ray.head import ray_head as start_head

BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="package")
def ray_head_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ray-head") / "head.log"


@pytest.fixture(scope="package")
def ray_head(ray_head_log: Path) -> Iterator[str]:
    """The head's dashboard address (``127.0.0.1:PORT``)."""
    if not os.path.exists(os.path.join(BIN, "ray")) or shutil.which("bash") is None:
        pytest.skip("ray is not installed (pip install 'torchx[ray]')")
    with start_head(BIN, ray_head_log, dict(os.environ)) as url:
        yield url.split("://")[1]


@pytest.fixture()
def env(ray_head: str, ray_head_log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # a head that died is named with why, not as each test's "Failed to connect"
    if not answers(f"http://{ray_head}"):
        pytest.fail(f"the Ray head at {ray_head} died: {ray_head_log.read_text()[-3000:]}")
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", f"http://{ray_head}")
    monkeypatch.delenv("TORCHX_TRACKERS", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path
