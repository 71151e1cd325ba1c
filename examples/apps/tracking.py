"""How the reference stages report to torchx's tracker, and how lineage follows the data.

Every output directory gets a ``_torchx_lineage.json`` marker naming the run that wrote
it; a stage that reads an input with a marker records that run as its source. So the
lineage graph (datapreproc -> dataset -> train -> model -> evaluate) needs no wiring by
the orchestrator. Outside a torchx job everything here quietly does nothing.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, Optional

from common import exists, join, read_json, write_json

logger = logging.getLogger(__name__)
MARKER = "_torchx_lineage.json"


class _NoRun:
    def job_id(self) -> str:
        return "<UNDEFINED>"

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def run() -> Any:
    """The tracker run of this job (a no-op object outside torchx or without torchx installed)."""
    try:
        from torchx.tracker import app_run_from_env
    except ImportError:
        logger.debug("torchx.tracker not importable; tracking disabled")
        return _NoRun()
    return app_run_from_env()


def is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def record_output(path: str, artifact: str, metadata: Optional[Dict[str, Any]] = None) -> None:
    """Log ``path`` as an artifact of this run and mark it so consumers can find this run."""
    r = run()
    meta = dict(metadata or {})
    r.add_artifact(artifact, path, meta)
    write_json(join(path, MARKER), {"run_id": r.job_id(), "artifact": artifact, **meta})


def record_input(path: str) -> Optional[Dict[str, Any]]:
    """If ``path`` was written by a tracked run, record that run as a source of this one."""
    marker = join(path, MARKER)
    if not exists(marker):
        return None
    info = read_json(marker)
    if info.get("run_id") and info["run_id"] != "<UNDEFINED>":
        run().add_source(info["run_id"], info.get("artifact"))
    return info
