"""A tracker that writes JSON records to any fsspec location (local dir, memory://, s3://...).

Config: a URL (``/tmp/tracking``, ``memory://t``) or, as upstream, a file of
``key=value`` lines with ``protocol`` and ``root_path`` (other keys go to
``fsspec.filesystem``). Layout: ``{root}/{b32(run_id)}/{metadata,artifacts,sources,
descendants,metrics}/<ns timestamp>.json`` plus ``parent.json``.
"""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional

import fsspec

from torchx.trackers.api import (
    TrackerArtifact,
    TrackerBase,
    TrackerConfigError,
    TrackerSource,
    read_config_file,
)


def _enc(run_id: str) -> str:
    return base64.b32encode(run_id.encode()).decode().rstrip("=")


def _dec(name: str) -> str:
    return base64.b32decode(name + "=" * (-len(name) % 8)).decode()


class FsspecTracker(TrackerBase):
    def __init__(self, fs: fsspec.AbstractFileSystem, root: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")

    def _dir(self, run_id: str, kind: str) -> str:
        return f"{self.root}/{_enc(run_id)}/{kind}"

    def _append(self, run_id: str, kind: str, record: Dict[str, Any]) -> None:
        d = self._dir(run_id, kind)
        self.fs.makedirs(d, exist_ok=True)
        with self.fs.open(f"{d}/{time.time_ns()}-{os.getpid()}.json", "w") as f:
            f.write(json.dumps(record))

    def _records(self, run_id: str, kind: str) -> List[Dict[str, Any]]:
        d = self._dir(run_id, kind)
        if not self.fs.exists(d):
            return []
        out = []
        for path in sorted(self.fs.ls(d, detail=False)):
            with self.fs.open(path, "r") as f:
                out.append(json.loads(f.read()))
        return out

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Optional[Mapping[str, object]] = None
    ) -> None:
        self._append(
            run_id, "artifacts", {"name": name, "path": path, "metadata": dict(metadata or {})}
        )

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return {
            r["name"]: TrackerArtifact(r["name"], r["path"], r["metadata"])
            for r in self._records(run_id, "artifacts")
        }

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self._append(run_id, "metadata", {k: v for k, v in kwargs.items()})

    def metadata(self, run_id: str) -> Mapping[str, object]:
        merged: Dict[str, object] = {}
        for r in self._records(run_id, "metadata"):
            merged.update(r)
        return merged

    def add_source(self, run_id: str, source_id: str, artifact_name: Optional[str] = None) -> None:
        self._append(
            run_id, "sources", {"source_run_id": source_id, "artifact_name": artifact_name}
        )
        self._append(
            source_id, "descendants", {"source_run_id": run_id, "artifact_name": artifact_name}
        )

    def sources(self, run_id: str, artifact_name: Optional[str] = None) -> Iterable[TrackerSource]:
        return [
            TrackerSource(r["source_run_id"], r["artifact_name"])
            for r in self._records(run_id, "sources")
            if artifact_name is None or r["artifact_name"] == artifact_name
        ]

    def descendants(self, run_id: str) -> Iterable[TrackerSource]:
        return [
            TrackerSource(r["source_run_id"], r["artifact_name"])
            for r in self._records(run_id, "descendants")
        ]

    def log_metrics(
        self, run_id: str, metrics: Mapping[str, float], step: Optional[int] = None
    ) -> None:
        self._append(run_id, "metrics", {"metrics": dict(metrics), "step": step})

    def metrics(self, run_id: str) -> List[Dict[str, Any]]:
        return self._records(run_id, "metrics")

    def set_parent(self, run_id: str, parent_run_id: str) -> None:
        self._append(run_id, "parent", {"parent_run_id": parent_run_id})

    def end_run(self, run_id: str, status: str) -> None:
        self.add_metadata(run_id, status=status)

    def run_ids(self, **kwargs: str) -> Iterable[str]:
        if not self.fs.exists(self.root):
            return []
        ids = [_dec(p.rstrip("/").rsplit("/", 1)[-1]) for p in self.fs.ls(self.root, detail=False)]
        parent = kwargs.get("parent_run_id")
        nested = (
            i for i in ids if any(r["parent_run_id"] == parent for r in self._records(i, "parent"))
        )
        return ids if parent is None else list(nested)


def create(config: Optional[str]) -> FsspecTracker:
    if not config:
        raise TrackerConfigError(
            "the fsspec tracker needs a config: a URL (e.g. /tmp/tracking) or a key=value file"
        )
    if os.path.isfile(config):
        kv: Dict[str, Any] = dict(read_config_file(config))
        if "protocol" not in kv or "root_path" not in kv:
            raise TrackerConfigError(
                f"fsspec tracker config {config} needs protocol= and root_path="
            )
        protocol, root = kv.pop("protocol"), kv.pop("root_path")
        return FsspecTracker(fsspec.filesystem(protocol, **kv), root)
    fs, root = fsspec.core.url_to_fs(config)
    return FsspecTracker(fs, root)
