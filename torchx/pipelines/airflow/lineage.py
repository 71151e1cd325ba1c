"""What a torchx stage read and wrote (and its ``cpu_hours`` / ``gpu_hours``), read back
from its tracker run once the app ended: the stages record their own inputs and outputs,
so the DAG never names a path twice. Best effort: a tracker that cannot answer is logged.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Tuple
from urllib.parse import urlsplit

from torchx.specs.errors import backend_errors

if TYPE_CHECKING:
    from torchx.trackers.api import TrackerArtifact

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageDataset:
    """One path a stage wrote or read: a URI, and what the producing run recorded about it."""

    uri: str
    artifact: str = ""
    kind: Optional[str] = None
    digest: Optional[str] = None
    producer: Optional[str] = None  # the torchx run (app handle) that wrote it


@dataclass
class StageLineage:
    """A stage's inputs and outputs, its tracker run (the backend's own id) and the run's UI
    link (the first tracker's with a UI; None without one)."""

    handle: str
    inputs: List[StageDataset] = field(default_factory=list)
    outputs: List[StageDataset] = field(default_factory=list)
    tracker: Optional[str] = None
    tracker_run_id: Optional[str] = None
    tracker_run_url: Optional[str] = None
    cpu_hours: Optional[float] = None  # requested resource-hours, from the run's metrics
    gpu_hours: Optional[float] = None

    def event_extra(self, dataset: StageDataset) -> Dict[str, str]:
        """What an Airflow Asset event for ``dataset`` carries (strings only)."""
        extra = {
            "torchx_app_handle": self.handle,
            "torchx_artifact": dataset.artifact,
            "type": dataset.kind,
            "digest": dataset.digest,
            "tracker": self.tracker,
            "tracker_run_id": self.tracker_run_id,
            "tracker_run_url": self.tracker_run_url,
        }
        return {k: str(v) for k, v in extra.items() if v}


def to_uri(path: str) -> str:
    """An fsspec path as a URI: URLs as they are, local paths as ``file:///absolute``."""
    if "://" in path:
        return path
    return "file://" + os.path.abspath(path)


def openlineage_name(uri: str) -> Tuple[str, str]:
    """OpenLineage's ``(namespace, name)`` for a URI, as its naming spec and Airflow's asset
    converters have it: ``("file", "/abs/path")``, ``("s3://bucket", "key")``."""
    parts = urlsplit(uri)
    if parts.scheme == "file":
        return ("file://" + parts.netloc if parts.netloc else "file"), parts.path or "/"
    return f"{parts.scheme}://{parts.netloc}", parts.path.strip("/") or "/"


def _dataset(artifact: Optional[TrackerArtifact], producer: str) -> Optional[StageDataset]:
    if artifact is None or not artifact.path:
        return None
    meta = dict(artifact.metadata or {})
    return StageDataset(
        uri=to_uri(artifact.path),
        artifact=artifact.name,
        kind=str(meta["type"]) if meta.get("type") else None,
        digest=str(meta["digest"]) if meta.get("digest") else None,
        producer=producer,
    )


def _add(into: List[StageDataset], dataset: Optional[StageDataset]) -> None:
    if dataset is not None and all(d.uri != dataset.uri for d in into):
        into.append(dataset)


def read_stage_lineage(handle: str, trackers: Mapping[str, Optional[str]]) -> StageLineage:
    """The datasets the app ``handle`` recorded as outputs, those it consumed (the producing
    runs' recorded paths) and its tracker run, from every configured tracker."""
    lineage = StageLineage(handle)
    if not trackers:
        return lineage
    try:
        from torchx.runner.resource_hours import CPU_HOURS, GPU_HOURS, recorded_hours
        from torchx.trackers.api import build_trackers

        built = build_trackers(trackers)
    except backend_errors() as e:  # lineage never fails a stage
        logger.warning("no lineage for %s: could not build trackers: %s", handle, e)
        return lineage
    for name, tracker in zip(trackers, built, strict=True):
        try:
            for artifact in tracker.artifacts(handle).values():
                _add(lineage.outputs, _dataset(artifact, handle))
            for source in tracker.sources(handle):
                consumed = tracker.artifacts(source.source_run_id).get(source.artifact_name or "")
                _add(lineage.inputs, _dataset(consumed, source.source_run_id))
            run_id = tracker.backend_run_id(handle) if lineage.tracker_run_id is None else None
            if run_id:  # the first tracker with runs of its own (MLflow)
                lineage.tracker, lineage.tracker_run_id = name, str(run_id)
                hours = recorded_hours(tracker, str(run_id))  # as the Runner logged them
                lineage.cpu_hours = hours.get(CPU_HOURS)
                lineage.gpu_hours = hours.get(GPU_HOURS)
        except backend_errors() as e:  # lineage is never worth failing a stage
            logger.warning("could not read the lineage of %s from %s: %s", handle, name, e)
        if lineage.tracker_run_url is None:
            try:
                lineage.tracker_run_url = tracker.run_url(handle)
            except backend_errors() as e:  # nor is a link
                logger.warning("could not link the tracker run of %s: %s", handle, e)
    return lineage
