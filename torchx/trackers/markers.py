"""Lineage that follows the data: a stage marks what it wrote, and whoever reads it links back.

``record_output(path, "model")`` logs ``path`` as an artifact of this job's tracker run and
writes a ``_torchx_lineage.json`` marker into it; ``record_input(path)`` reads that marker
and records the producing run as a source of this one. Two lines per stage, no wiring by
the orchestrator. Paths are fsspec URLs (local paths, ``s3://``, ``memory://``, ...).
Outside a torchx job (no ``TORCHX_JOB_ID``) nothing is recorded but the marker.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Mapping, Optional, Tuple

from torchx.trackers.api import UNDEFINED_RUN_ID, app_run_from_env

MARKER = "_torchx_lineage.json"


def _fs(path: str) -> Any:
    import fsspec

    return fsspec.core.url_to_fs(path)


def _marker(path: str) -> Tuple[Any, str]:
    """The filesystem of ``path``, and the marker's path: in a directory, beside a file."""
    fs, root = _fs(path)
    return fs, f"{root.rstrip('/')}/{MARKER}" if fs.isdir(root) else f"{root}.{MARKER}"


def path_digest(path: str) -> str:
    """A digest of ``path``'s contents that every process computes alike: the sorted names
    and sizes of its files (not Python's per-process ``hash``), without the marker."""
    import hashlib  # here: ``torchx.trackers`` is imported by every CLI run (OpenSSL, ~3 ms)

    fs, root = _fs(path)
    h = hashlib.sha256(root.encode())
    if fs.isdir(root):
        files = fs.find(root, detail=True)
        for name in sorted(files):
            rel = os.path.relpath(name, root)
            if rel != MARKER:
                h.update(f"{rel}\0{files[name].get('size')}\n".encode())
    elif fs.exists(root):
        h.update(str(fs.size(root)).encode())
    return h.hexdigest()[:32]


def record_output(
    path: str, artifact: str, metadata: Optional[Mapping[str, Any]] = None
) -> Dict[str, Any]:
    """Log ``path`` as artifact ``artifact`` of this job's run and mark it with the run id."""
    run = app_run_from_env()
    meta: Dict[str, Any] = {"digest": path_digest(path), **dict(metadata or {})}
    run.add_artifact(artifact, path, meta)
    marker = {"run_id": run.job_id(), "artifact": artifact, **meta}
    fs, target = _marker(path)
    with fs.open(target, "w") as f:
        json.dump(marker, f)
    return marker


def record_input(path: str) -> Optional[Dict[str, Any]]:
    """If a tracked run wrote ``path``, record it as a source of this job; returns its marker."""
    fs, target = _marker(path)
    if not fs.exists(target):
        return None
    with fs.open(target) as f:
        marker = json.load(f)
    if marker.get("run_id") and marker["run_id"] != UNDEFINED_RUN_ID:
        app_run_from_env().add_source(marker["run_id"], marker.get("artifact"))
    return marker
