"""Resource-hours of a job and of a pipeline run: the one place they are computed.

What they count (what the AppDef requested) and where the wall time comes from:
docs/tracking.md, "Resource-hours".
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence

from torchx.specs.api import Role
from torchx.specs.errors import backend_errors

logger = logging.getLogger(__name__)

ENV_JOB_START_MS = "TORCHX_JOB_START_MS"
CPU_HOURS, GPU_HOURS = "cpu_hours", "gpu_hours"


@dataclass(frozen=True)
class ResourceHours:
    """Requested cpu- and gpu-hours of a job (or the sum over a pipeline's stages)."""

    cpu_hours: float = 0.0
    gpu_hours: float = 0.0

    def __add__(self, other: ResourceHours) -> ResourceHours:
        return ResourceHours(self.cpu_hours + other.cpu_hours, self.gpu_hours + other.gpu_hours)

    def metrics(self) -> Dict[str, float]:
        """As tracker metrics: ``{"cpu_hours": ..., "gpu_hours": ...}``."""
        return {CPU_HOURS: self.cpu_hours, GPU_HOURS: self.gpu_hours}


def resource_hours(roles: Sequence[Role], start: float, end: float) -> ResourceHours:
    """What ``roles`` requested, times the wall time from ``start`` to ``end`` (epoch s)."""
    hours = max(0.0, end - start) / 3600.0
    cpu = sum(max(0.0, float(r.resource.cpu)) * max(0, r.num_replicas) for r in roles)
    gpu = sum(max(0, int(r.resource.gpu)) * max(0, r.num_replicas) for r in roles)
    return ResourceHours(cpu * hours, gpu * hours)


def job_start(env: Mapping[str, str]) -> Optional[float]:
    """When the job was submitted (epoch s), from its env; None if it does not say."""
    try:
        value = float(env[ENV_JOB_START_MS]) / 1000.0
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def run_metrics(tracker: object, run_id: str, by_time: Sequence[str] = ()) -> Dict[str, float]:
    """The latest value of each metric of the tracker run ``run_id`` (the backend's id: an
    MLflow run id) as MLflow keeps it (its highest step's), the ``by_time`` keys' newest by
    time. {} in a tracker without metrics."""
    from torchx.trackers.api import TrackerBase  # with trackers only

    if not isinstance(tracker, TrackerBase):
        return {}
    latest = tracker.latest_metrics(run_id, tuple(by_time))
    return {key: float(value) for key, (value, _) in latest.items()}


def recorded_hours(tracker: object, run_id: str) -> Dict[str, float]:
    """``cpu_hours`` / ``gpu_hours`` as the Runner that saw the app end recorded them."""
    metrics = run_metrics(tracker, run_id, (CPU_HOURS, GPU_HOURS))
    return {k: v for k, v in metrics.items() if k in (CPU_HOURS, GPU_HOURS)}


def stage_hours(tracker: object, pipeline_run_id: str) -> Optional[ResourceHours]:
    """The sum of ``cpu_hours`` / ``gpu_hours`` over the stage runs of a pipeline run in
    one tracker (None: the tracker keeps no metrics, or no stage recorded any)."""
    from torchx.trackers.api import TrackerBase  # with trackers only

    if not isinstance(tracker, TrackerBase) or not tracker.keeps_metrics:
        return None  # nothing to sum: its runs are not even listed
    stages = tracker.stage_metrics(pipeline_run_id)  # one paged search where it can
    if stages is None:  # a backend that reads stages one by one
        stages = []
        for stage in tracker.run_ids(parent_run_id=pipeline_run_id):
            rid = tracker.backend_run_id(stage)
            stages.append(recorded_hours(tracker, rid) if rid else {})
    total: Optional[ResourceHours] = None
    missing = 0
    for metrics in stages:
        if CPU_HOURS not in metrics and GPU_HOURS not in metrics:
            missing += 1
            continue
        part = ResourceHours(metrics.get(CPU_HOURS, 0.0), metrics.get(GPU_HOURS, 0.0))
        total = part if total is None else total + part
    if missing:
        logger.warning(
            "%d of the %d stage runs of %s recorded no resource-hours: %s",
            missing, len(stages), pipeline_run_id,
            "their sum leaves them out" if total is not None else "no sum",
        )  # fmt: skip
    return total


def record_pipeline_hours(
    run_id: str, trackers: Mapping[str, Optional[str]]
) -> Optional[ResourceHours]:
    """Log the stages' summed resource-hours on the pipeline run ``run_id`` in every
    tracker that has them; returns the first sum (None if none). Best effort: a tracker
    that cannot answer is one warning."""
    from torchx.trackers.api import build_trackers

    found: Optional[ResourceHours] = None
    for name, tracker in zip(trackers, build_trackers(trackers), strict=True):
        try:
            total = stage_hours(tracker, tracker.resolve_run_id(run_id))
            if total is not None:
                tracker.log_metrics(tracker.resolve_run_id(run_id), total.metrics())
                found = found or total
        except backend_errors() as e:  # a sum is never worth failing the pipeline's end
            logger.warning("could not sum the resource-hours of %s in %s: %s", run_id, name, e)
    return found
