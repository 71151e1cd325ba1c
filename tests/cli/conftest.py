"""What the CLI tests share: an env for the real ``torchx`` command with a fresh home and
none of the caller's torchx settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture()
def env(tmp_path: Path) -> dict:
    e = dict(os.environ)
    e.update({"TORCHX_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)})
    for k in ("TORCHXCONFIG", "TORCHX_TRACKERS", "TORCHX_PARENT_RUN_ID", "LOGLEVEL"):
        e.pop(k, None)
    for k in [k for k in e if k.startswith("PET_")]:
        e.pop(k)
    return e
