"""Where torchx keeps its own files (local job state, the embedded MLflow store)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_TORCHX_HOME = "TORCHX_HOME"


def torchx_home() -> Path:
    """``$TORCHX_HOME`` or ``~/.torchx``; created on first use."""
    home = Path(os.environ.get(ENV_TORCHX_HOME) or Path.home() / ".torchx")
    home.mkdir(parents=True, exist_ok=True)
    return home
