"""The launched app's resources on the launcher's KFP task, set when the pipeline is built,
so the compiled IR shows what the stage asks for (one replica's; KFP has no replica count).
The task config passes them to the app, not to the launcher's pod.

Pipeline parameters are unknown at build time: a ``--cpu`` or ``--gpu`` parameter becomes
a runtime resource (KFP resolves it), others use the component's default for the view.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from torchx.specs.api import AppDef, Resource
from torchx.specs.errors import TorchXError

logger = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
_FILLER = "_"


@dataclass
class LauncherResources:
    """One replica's resources, and the resources that are pipeline parameters."""

    resource: Optional[Resource]
    runtime: Dict[str, Any] = field(default_factory=dict)  # "cpu"/"gpu" -> PipelineChannel


def _is_channel(value: Any) -> bool:
    from kfp.dsl import pipeline_channel

    channel = isinstance(value, pipeline_channel.PipelineChannel)
    return channel or (isinstance(value, str) and "{{channel:" in value)


def _flag(arg: Any) -> Optional[str]:
    if isinstance(arg, str) and arg.startswith("-") and not _is_channel(arg):
        return arg.lstrip("-").split("=", 1)[0] or None
    return None


def _build_time_args(fn: Any, args: Sequence[Any]) -> tuple[List[str], Dict[str, Any]]:
    """``args`` with pipeline parameters replaced: a parameter of an argument that has a
    default is dropped (the default stands in); others become a filler text."""
    params = inspect.signature(fn).parameters
    out: List[str] = []
    dynamic: Dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg, name = args[i], _flag(args[i])
        if name is not None and name in params:
            inline = "=" in arg
            value = arg.split("=", 1)[1] if inline else (args[i + 1] if i + 1 < len(args) else "")
            step = 1 if inline else 2
            if _is_channel(value):
                dynamic[name] = value
                if params[name].default is inspect.Parameter.empty:
                    out += [f"--{name}", _FILLER]
            else:
                out += [arg] if inline else [arg, str(value)]
            i += step
            continue
        out.append(_FILLER if _is_channel(arg) else str(arg))
        i += 1
    return out, dynamic


def _one_resource(app: AppDef) -> Optional[Resource]:
    """The replicas' resource when every role asks for the same (the task config applies
    one resource to all roles), else None."""
    resources = {
        (r.resource.cpu, r.resource.memMB, r.resource.gpu, repr(r.resource.capabilities))
        for r in app.roles
    }
    if len(resources) != 1:
        logger.info(
            "app %s: roles ask for different resources; the KFP task carries none", app.name
        )
        return None
    return app.roles[0].resource


def launcher_resources(component: Any, component_args: Any) -> Optional[LauncherResources]:
    """The resources ``torchx_launcher`` will give the app, None when they are unknown at
    build time. Invalid constant arguments (``-j bad``) raise here, as at run time."""
    if not isinstance(component, str) or _is_channel(component):
        return None
    if not isinstance(component_args, (list, tuple)):
        return None
    from torchx.runner.api import get_runner
    from torchx.specs.finder import ComponentNotFoundException, get_component

    try:
        fn = get_component(component).fn
    except ComponentNotFoundException as e:
        logger.info("no build-time resources for %s: %s", component, e)
        return None
    args, dynamic = _build_time_args(fn, component_args)
    with get_runner(trackers={}) as runner:
        try:
            app = runner.materialize_component(component, args)
        except TorchXError as e:
            if not dynamic and not any(_is_channel(a) for a in component_args):
                raise
            logger.info("no build-time resources for %s (pipeline parameters): %s", component, e)
            return None
    runtime = {k: v for k, v in dynamic.items() if k in ("cpu", "gpu")}
    if "h" in dynamic:  # a named resource chosen at run time: nothing is known now
        return LauncherResources(None, runtime)
    resource = _one_resource(app)
    if resource is not None and "memMB" in dynamic:
        # KFP reads a bare number as bytes, not MB: no build-time memory for a parameter
        resource = Resource(cpu=resource.cpu, gpu=resource.gpu, memMB=0)
    return LauncherResources(resource, runtime)


def set_task_resources(
    task: Any, found: Optional[LauncherResources], memory_unit: str = "Mi"
) -> None:
    """Requests and limits on the KFP task: equal, as torchx resources are exact."""
    if found is None:
        return
    res = found.resource
    cpu = found.runtime.get("cpu") or (str(res.cpu) if res is not None and res.cpu > 0 else None)
    if cpu is not None:
        task.set_cpu_request(cpu).set_cpu_limit(cpu)
    if res is not None and res.memMB > 0:
        # Mi for the launcher: its task config reads it back as the same memMB (memory_mib)
        memory = f"{res.memMB}{memory_unit}"
        task.set_memory_request(memory).set_memory_limit(memory)
    gpu = found.runtime.get("gpu") or (str(res.gpu) if res is not None and res.gpu > 0 else None)
    if gpu is not None:
        kind = GPU_RESOURCE
        if res is not None:
            kind = str(res.capabilities.get("accelerator", GPU_RESOURCE))
        task.set_accelerator_type(kind).set_accelerator_limit(gpu)
