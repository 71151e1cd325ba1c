"""Trackers: record what a torchx job produced and consumed (fsspec and MLflow backends)."""

from torchx.runtime.progress import report_progress
from torchx.trackers.api import (
    ENV_TORCHX_JOB_ID,
    ENV_TORCHX_PARENT_RUN_ID,
    ENV_TORCHX_TRACKERS,
    AppRun,
    AppRunTrackableSource,
    Lineage,
    LineageEdge,
    TrackerArtifact,
    TrackerBase,
    TrackerConfigError,
    TrackerSource,
    app_run_from_env,
    build_trackers,
    tracker_config_env_var_name,
    trackers_from_environ,
)
from torchx.trackers.markers import record_input, record_output

__all__ = [
    "ENV_TORCHX_JOB_ID",
    "ENV_TORCHX_PARENT_RUN_ID",
    "ENV_TORCHX_TRACKERS",
    "AppRun",
    "AppRunTrackableSource",
    "Lineage",
    "LineageEdge",
    "TrackerArtifact",
    "TrackerBase",
    "TrackerConfigError",
    "TrackerSource",
    "app_run_from_env",
    "build_trackers",
    "record_input",
    "record_output",
    "report_progress",
    "tracker_config_env_var_name",
    "trackers_from_environ",
]
