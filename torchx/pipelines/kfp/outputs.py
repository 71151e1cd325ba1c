"""What a finished stage recorded, read back from its tracker run, as the launcher's KFP
typed outputs (``Metrics``, ``Model``, ``Dataset``), so the KFP UI shows lineage in its own
terms. An output is a ``Model`` when recorded with ``{"type": "model"}`` (or named
``model``), a ``Dataset`` likewise; the artifact's URI is where the stage wrote it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

from torchx.runner.resource_hours import run_metrics
from torchx.specs.errors import backend_errors
from torchx.trackers.api import TrackerArtifact, TrackerBase, build_trackers

logger = logging.getLogger(__name__)


@dataclass
class StageRecord:
    """A stage's tracker run as the launcher returns it ("" / empty without trackers)."""

    run_id: str = ""
    run_url: str = ""
    metrics: Dict[str, float] = field(default_factory=dict)
    artifacts: Dict[str, TrackerArtifact] = field(default_factory=dict)
    progress: Any = None  # the job's last progress report (``Progress``), if it reported


def _backend_run_id(tracker: TrackerBase, handle: str) -> Optional[str]:
    """The backend's id of the app's run (MLflow's run id), None if it has no run."""
    if tracker.keeps_metrics:  # a backend with runs of its own (MLflow)
        return tracker.backend_run_id(handle)
    return handle if list(tracker.metadata(handle) or {}) else None


def read_stage(handle: str, trackers: Mapping[str, Optional[str]]) -> StageRecord:
    """The app's run in the first tracker that has one; failures to read are logged (a
    stage that succeeded never fails on its outputs)."""
    try:
        backends = build_trackers(trackers)
    except backend_errors() as e:  # a stage never fails on its tracker
        logger.warning("could not open trackers to read %s back: %s", handle, e)
        return StageRecord()
    for tracker in backends:
        try:
            run_id = _backend_run_id(tracker, handle)
            if not run_id:
                continue
            return StageRecord(
                run_id=run_id,
                run_url=tracker.run_url(handle) or "",
                metrics=run_metrics(tracker, run_id),
                artifacts=dict(tracker.artifacts(handle)),
            )
        except backend_errors() as e:  # the outputs go without the run
            logger.warning("could not read the tracker run of %s: %s", handle, e)
    return StageRecord()


def _recorded(record: StageRecord, kind: str) -> Optional[TrackerArtifact]:
    typed = [a for a in record.artifacts.values() if (a.metadata or {}).get("type") == kind]
    named = [a for a in record.artifacts.values() if a.name == kind]
    found = sorted(typed, key=lambda a: a.name) or named
    return found[0] if found else None


def fill_outputs(record: StageRecord, handle: str, metrics: Any, model: Any, dataset: Any) -> None:
    """Fill the launcher's KFP artifacts (``dsl.Metrics``, ``dsl.Model``, ``dsl.Dataset``)."""
    for name, value in sorted(record.metrics.items()):
        if not name.startswith("progress_"):  # the run's copy of the report: step, total below
            metrics.log_metric(name, value)
    if record.progress is not None:  # the last report: step, total and its metrics
        metrics.log_metric("step", record.progress.step)
        if record.progress.total is not None:
            metrics.log_metric("total", record.progress.total)
        for name, value in sorted(record.progress.metrics.items()):
            metrics.log_metric(name, value)
    run = {"tracker_run_id": record.run_id, "tracker_run_url": record.run_url}
    for artifact, kind in ((model, "model"), (dataset, "dataset")):
        meta: Dict[str, Any] = {"torchx_app": handle, **{k: v for k, v in run.items() if v}}
        recorded = _recorded(record, kind)
        meta["recorded"] = recorded is not None
        if recorded is not None:
            path = recorded.path
            artifact.uri = path[len("file://") :] if path.startswith("file://") else path
            meta["artifact"] = recorded.name
            meta.update({k: v for k, v in (recorded.metadata or {}).items() if k != "type"})
        artifact.metadata.update(meta)
