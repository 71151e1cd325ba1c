"""Kubeflow Pipelines v2 integration (``pip install 'torchx[kfp]'``; kfp loads on use).

- ``component_from_app`` / ``container_from_app``: a single-role, single-replica AppDef
  as a KFP container component, its task carrying the role's resources.
- ``torchx_launcher``: a KFP component that runs any component or AppDef through the Runner
  (distributed and elastic stages: KFP v2 has no ``ResourceOp``).
- ``python -m torchx.pipelines.kfp.compile module:pipeline out.yaml`` compiles to IR YAML.
"""

from __future__ import annotations

from torchx.util.lazy import lazy_getattr

_ADAPTER = ("component_from_app", "container_from_app", "component_spec_from_app")
_COMPONENTS = ("torchx_launcher", "start_pipeline_run", "close_pipeline_run")
_LAZY = {
    **dict.fromkeys(_ADAPTER, "torchx.pipelines.kfp.adapter"),
    **dict.fromkeys(_COMPONENTS, "torchx.pipelines.kfp.components"),
}


__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = list(_LAZY)
