"""Prefect 3 integration: torchx tasks (``submit``, ``wait``, ``cancel``, ``run``), the
``TorchXJob`` job block, and a flow hook that cancels a cancelled flow run's apps.

Importing this package does not import Prefect; names load on first access.
"""

from __future__ import annotations

from torchx.util.lazy import lazy_getattr

_LAZY = {
    "submit": "torchx.pipelines.prefect.tasks",
    "wait": "torchx.pipelines.prefect.tasks",
    "cancel": "torchx.pipelines.prefect.tasks",
    "run": "torchx.pipelines.prefect.tasks",
    "TorchXJobFailed": "torchx.pipelines.prefect.tasks",
    "cancel_flow_run_apps": "torchx.pipelines.prefect.tasks",
    "pipeline_run_id": "torchx.pipelines.prefect.tasks",
    "close_pipeline_run": "torchx.pipelines.prefect.tasks",
    "TorchXJob": "torchx.pipelines.prefect.blocks",
    "TorchXJobRun": "torchx.pipelines.prefect.blocks",
}


__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = list(_LAZY)
