"""Where torchx keeps its own files (local job state, the embedded MLflow store)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

ENV_TORCHX_HOME = "TORCHX_HOME"


def torchx_home(given: Union[str, Path, None] = None) -> Path:
    """``given`` (a scheduler's ``torchx_home`` parameter, e.g. from an Airflow Connection),
    else ``$TORCHX_HOME``, else ``~/.torchx``; created on first use, readable by its owner
    only (job requests hold the replicas' environment, secrets included)."""
    home = Path(given or os.environ.get(ENV_TORCHX_HOME) or Path.home() / ".torchx")
    if not home.is_dir():
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home
