"""Where torchx keeps its own files (local job state, the embedded MLflow store)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_TORCHX_HOME = "TORCHX_HOME"


def torchx_home() -> Path:
    """``$TORCHX_HOME`` or ``~/.torchx``; created on first use, readable by its owner only
    (job requests hold the replicas' environment, secrets included)."""
    home = Path(os.environ.get(ENV_TORCHX_HOME) or Path.home() / ".torchx")
    if not home.is_dir():
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home
