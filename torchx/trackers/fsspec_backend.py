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
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import fsspec

from torchx.trackers.api import (
    StepMetrics,
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
        paths = sorted(self.fs.ls(d, detail=False)) if self.fs.exists(d) else []
        return [json.loads(self.fs.cat_file(path)) for path in paths]

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Optional[Mapping[str, object]] = None
    ) -> None:
        record = {"name": name, "path": path, "metadata": dict(metadata or {})}
        self._append(run_id, "artifacts", record)

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return {
            r["name"]: TrackerArtifact(r["name"], r["path"], r["metadata"])
            for r in self._records(run_id, "artifacts")
        }

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self._append(run_id, "metadata", dict(kwargs))

    def metadata(self, run_id: str) -> Mapping[str, object]:
        merged: Dict[str, object] = {}
        for r in self._records(run_id, "metadata"):
            merged.update(r)
        return merged

    def add_source(self, run_id: str, source_id: str, artifact_name: Optional[str] = None) -> None:
        """A source on this run, and this run as a descendant on the source."""
        for owner, other, kind in (
            (run_id, source_id, "sources"),
            (source_id, run_id, "descendants"),
        ):
            self._append(owner, kind, {"source_run_id": other, "artifact_name": artifact_name})

    def sources(self, run_id: str, artifact_name: Optional[str] = None) -> Iterable[TrackerSource]:
        found = [TrackerSource(**r) for r in self._records(run_id, "sources")]
        return [s for s in found if artifact_name is None or s.artifact_name == artifact_name]

    def descendants(self, run_id: str) -> Iterable[TrackerSource]:
        return [TrackerSource(**r) for r in self._records(run_id, "descendants")]

    def log_metrics(
        self, run_id: str, metrics: Mapping[str, float], step: Optional[int] = None
    ) -> None:
        self._append(run_id, "metrics", {"metrics": dict(metrics), "step": step})

    def log_metrics_batch(self, run_id: str, batch: Sequence[StepMetrics]) -> None:
        """One appended record per step, all in one file (``metrics`` reads them back)."""
        steps = [{"metrics": dict(m), "step": step, "timestamp": ts} for m, step, ts in batch]
        if steps:
            self._append(run_id, "metrics", {"batch": steps})

    def metrics(self, run_id: str) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        for record in self._records(run_id, "metrics"):
            out.extend(record["batch"] if "batch" in record else [record])
        return out

    def set_parent(self, run_id: str, parent_run_id: str) -> None:
        self._append(run_id, "parent", {"parent_run_id": parent_run_id})

    def end_run(self, run_id: str, status: str) -> None:
        self.add_metadata(run_id, status=status)

    def run_ids(self, **kwargs: str) -> Iterable[str]:
        dirs = self.fs.ls(self.root, detail=False) if self.fs.exists(self.root) else []
        ids = [_dec(p.rstrip("/").rsplit("/", 1)[-1]) for p in dirs]
        parent = kwargs.get("parent_run_id")
        if parent is None:
            return ids
        return [i for i in ids if {"parent_run_id": parent} in self._records(i, "parent")]


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
