"""The Ray tests' one local Ray head (loopback only), started for the first test of this
package and stopped after its last: both modules use it, and one start (20-30 s on a loaded
machine) is enough. Every Ray test runs on one worker (tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

BIN = os.path.dirname(sys.executable)
DASHBOARD = "127.0.0.1:8297"


@pytest.fixture(scope="package")
def ray_head() -> Iterator[str]:
    ray = os.path.join(BIN, "ray")
    if not os.path.exists(ray) or shutil.which("bash") is None:
        pytest.skip("ray is not installed (pip install 'torchx[ray]')")
    env = dict(
        os.environ,
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        PATH=f"{BIN}:{os.environ.get('PATH', '')}",
    )
    # a head an earlier run left behind (or its session) would take the fixed ports
    subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120)
    start = subprocess.run(
        [
            ray,
            "start",
            "--head",
            "--num-cpus",
            "2",
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            "6397",
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            DASHBOARD.split(":")[1],
            "--disable-usage-stats",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        yield DASHBOARD
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120)


@pytest.fixture()
def env(ray_head: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", f"http://{ray_head}")
    monkeypatch.delenv("TORCHX_TRACKERS", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path
