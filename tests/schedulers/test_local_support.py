"""Helpers shared by the ``test_local_*`` files (no tests here): an isolated
``$TORCHX_HOME``, small apps, and where an app's files are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Optional

import psutil
import pytest

from tests.polling import poll
from torchx import specs

TORCHX = str(Path(sys.executable).parent / "torchx")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh ``$TORCHX_HOME`` (returned), with the cwd in ``tmp_path``."""
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


def role(script: str, name: str = "w", n: int = 1, **kw: Any) -> specs.Role:
    return specs.Role(
        name=name, image=".", entrypoint="sh", args=["-c", script], num_replicas=n, **kw
    )


def app(*roles: specs.Role, name: str = "t") -> specs.AppDef:
    return specs.AppDef(name=name, roles=list(roles))


def app_dir(handle_or_id: str, session: str = "torchx") -> Path:
    app_id = handle_or_id.rsplit("/", 1)[-1]
    return Path(os.environ["TORCHX_HOME"]) / "local_cwd" / session / app_id


def state(handle: str) -> Dict[str, Any]:
    return json.loads((app_dir(handle) / "state.json").read_text())


def replica_pids(handle: str) -> List[int]:
    """Main pids of the replicas, once the supervisor recorded them all."""

    def recorded() -> Optional[List[int]]:
        try:
            reps = state(handle)["replicas"]
        except (OSError, ValueError):
            return None
        pids = [r["pid"] for r in reps]
        return pids if pids and all(pids) else None

    return poll(recorded, what=f"replica pids of {handle}")


def alive(pids: List[int]) -> List[int]:
    """The pids that still run (zombies do not)."""
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


def tree(pid: int) -> List[int]:
    try:
        return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def run_python(code: str, cwd: Path, *args: str, timeout: float = 120) -> str:
    """Run ``code`` in a fresh interpreter (same environment); its stdout."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
        cwd=cwd,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def torchx(
    *args: str, cwd: Optional[Path] = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TORCHX, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
        cwd=cwd,
    )
