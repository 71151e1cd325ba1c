"""Trackers: record what a torchx job produced and consumed (fsspec and MLflow backends).

The names below load on first use: the Runner imports ``torchx.trackers.env`` on every
submit (its tracker session is ``torchx.runner.tracker_session``), and a job without
trackers needs nothing else (``api``: backends, dataclasses, protocols; ``markers``:
fsspec, hashlib). Inside torchx, import from the defining module
(``tests/util/test_import_graph.py``).
"""

from torchx.util.lazy import lazy_getattr

# defining module: the names it gives this package
_NAMES = {
    "torchx.runtime.progress": "report_progress",
    "torchx.trackers.env": "ENV_TORCHX_JOB_ID ENV_TORCHX_PARENT_RUN_ID ENV_TORCHX_TRACKERS"
    " tracker_config_env_var_name",
    "torchx.trackers.api": "AppRun AppRunTrackableSource Lineage LineageEdge TrackerArtifact"
    " TrackerBase TrackerConfigError TrackerSource app_run_from_env build_trackers"
    " trackers_from_environ",
    "torchx.trackers.markers": "record_input record_output",
}
_LAZY = {name: module for module, names in _NAMES.items() for name in names.split()}
__all__ = sorted(_LAZY)
__getattr__ = lazy_getattr(__name__, _LAZY, submodules=True)


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))
