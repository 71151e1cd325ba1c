"""Where torchx keeps its own files (local job state, the embedded MLflow store)."""

from __future__ import annotations

import os
import threading
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


def write_private(path: Union[str, Path], text: str) -> None:
    """Replace ``path`` with ``text``, readable by its owner only (0600; a directory it
    creates is 0700), atomically: a reader sees the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            os.fchmod(f.fileno(), 0o600)  # O_CREAT's mode does not apply to an existing file
            f.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # left only when the write failed
