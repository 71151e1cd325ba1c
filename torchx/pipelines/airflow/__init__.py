"""Airflow integration: ``TorchXOperator`` (deferrable, cancel-safe, retry-safe),
``TorchXTrigger``, ``TorchXSensor`` and ``TorchXHook`` (connection type ``torchx``).
Registered as an Airflow provider.

Importing this package does not import Airflow; the classes load on first access.
"""

from __future__ import annotations

from typing import Any, Dict

from torchx.util.lazy import lazy_getattr

_LAZY = {
    "TorchXOperator": "torchx.pipelines.airflow.operator",
    "TorchXAppLink": "torchx.pipelines.airflow.operator",
    "TorchXMLflowLink": "torchx.pipelines.airflow.operator",
    "close_pipeline_run": "torchx.pipelines.airflow.operator",
    "pipeline_run_id": "torchx.pipelines.airflow.operator",
    "TorchXTrigger": "torchx.pipelines.airflow.trigger",
    "TorchXSensor": "torchx.pipelines.airflow.sensor",
    "TorchXHook": "torchx.pipelines.airflow.hook",
}
# the provider's kinds of classes, and the module of each
_MODULES = {"operators": "operator", "triggers": "trigger", "sensors": "sensor", "hooks": "hook"}


def get_provider_info() -> Dict[str, Any]:
    """Provider metadata for the ``apache_airflow_provider`` entry point."""
    from torchx import __version__

    return {
        "package-name": "torchx",
        "name": "TorchX",
        "description": "Launch PyTorch jobs (single-process, distributed, elastic)"
        " on local processes, Slurm, Kubernetes, AWS Batch or Ray.",
        "versions": [__version__],
        **{
            kind: [{"integration-name": "TorchX", "python-modules": [f"{__name__}.{module}"]}]
            for kind, module in _MODULES.items()
        },
        "connection-types": [
            {
                "hook-class-name": "torchx.pipelines.airflow.hook.TorchXHook",
                "connection-type": "torchx",
            }
        ],
        "extra-links": [
            "torchx.pipelines.airflow.operator.TorchXAppLink",
            "torchx.pipelines.airflow.operator.TorchXMLflowLink",
        ],
    }


__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "TorchXOperator",
    "TorchXAppLink",
    "TorchXMLflowLink",
    "TorchXTrigger",
    "TorchXSensor",
    "TorchXHook",
    "get_provider_info",
]
