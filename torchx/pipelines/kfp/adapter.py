"""Single-replica AppDefs as KFP v2 container components.

Arguments of the role may name typed inputs and outputs, which become KFP
placeholders so stages can be wired: ``${input:data}`` (an input artifact's path),
``${output:model}`` (an output artifact's path), ``${param:epochs}`` (a parameter).
"""

from __future__ import annotations

import re
from typing import Any, Dict, Optional, Tuple

from torchx.specs.api import AppDef, InvalidArgumentError, Role
from torchx.util.modules import import_optional

_TOKEN = re.compile(r"\$\{(input|output|param):([A-Za-z_][\w]*)\}")
ARTIFACT_TYPES = {
    "Dataset": "system.Dataset@0.0.1",
    "Model": "system.Model@0.0.1",
    "Metrics": "system.Metrics@0.0.1",
    "Artifact": "system.Artifact@0.0.1",
}


def _single_role(app: AppDef) -> Role:
    if len(app.roles) != 1 or app.roles[0].num_replicas != 1:
        raise InvalidArgumentError(
            f"app {app.name!r} has {len(app.roles)} role(s)"
            f" / {app.roles[0].num_replicas if app.roles else 0} replica(s);"
            " a KFP container component runs one process:"
            " use torchx_launcher for distributed or multi-role apps"
        )
    return app.roles[0]


def _arg(value: str, types: Dict[str, str]) -> Any:
    """A role argument with tokens replaced by KFP placeholders.

    Concatenated when mixed with text.
    """
    parts: list = []
    pos = 0
    for m in _TOKEN.finditer(value):
        if m.start() > pos:
            parts.append(value[pos : m.start()])
        kind, name = m.groups()
        parts.append(
            {
                "input": {"inputPath": name},
                "output": {"outputPath": name},
                "param": {"inputValue": name},
            }[kind]
        )
        pos = m.end()
    if pos < len(value):
        parts.append(value[pos:])
    if len(parts) == 1:
        return parts[0]
    return {"concat": parts}


def component_spec_from_app(
    app: AppDef, inputs: Optional[Dict[str, str]] = None, outputs: Optional[Dict[str, str]] = None
) -> Tuple[Dict[str, Any], Role]:
    """The component spec (as a dict) of a single-role app, and its role.

    ``inputs``/``outputs`` map names used in ``${input:x}``/``${output:x}``/``${param:x}``
    tokens to types: ``Dataset``, ``Model``, ``Metrics``, ``Artifact`` or
    ``String``/``Integer``/``Float``.
    """
    role = _single_role(app)
    inputs, outputs = dict(inputs or {}), dict(outputs or {})
    used = {m.group(2) for a in role.args for m in _TOKEN.finditer(a)}
    missing = used - set(inputs) - set(outputs)
    if missing:
        raise InvalidArgumentError(
            f"app {app.name!r}: arguments use {sorted(missing)} but no inputs/outputs declare them"
        )
    spec = {
        "name": f"{app.name}-{role.name}",
        "description": f"torchx component {app.name}, role {role.name}",
        "inputs": [{"name": n, "type": t} for n, t in inputs.items()],
        "outputs": [{"name": n, "type": t} for n, t in outputs.items()],
        "implementation": {
            "container": {
                "image": role.image,
                "command": [role.entrypoint],
                "args": [_arg(a, {**inputs, **outputs}) for a in role.args],
                "env": dict(role.env),
            }
        },
    }
    return spec, role


def component_from_app(
    app: AppDef, inputs: Optional[Dict[str, str]] = None, outputs: Optional[Dict[str, str]] = None
) -> Any:
    """A KFP component factory.

    Calling it makes a task that carries the role's resources and env.
    """
    import yaml

    components = import_optional("kfp.components", "kfp")
    spec, role = component_spec_from_app(app, inputs, outputs)
    env = spec["implementation"]["container"].pop("env")
    factory = components.load_component_from_text(yaml.safe_dump(spec, sort_keys=False))

    def make_task(*args: Any, **kwargs: Any) -> Any:
        task = factory(*args, **kwargs)
        res = role.resource
        if res.cpu > 0:
            task.set_cpu_request(str(res.cpu)).set_cpu_limit(str(res.cpu))
        if res.memMB > 0:
            task.set_memory_request(f"{res.memMB}M").set_memory_limit(f"{res.memMB}M")
        if res.gpu > 0:
            task.set_accelerator_type(str(res.capabilities.get("accelerator", "nvidia.com/gpu")))
            task.set_accelerator_limit(str(res.gpu))
        for k, v in env.items():
            task.set_env_variable(k, v)
        task.set_display_name(spec["name"])
        return task

    make_task.component_spec = factory.component_spec  # type: ignore[attr-defined]
    make_task.__name__ = spec["name"].replace("-", "_")
    return make_task


def container_from_app(
    app: AppDef,
    *args: Any,
    inputs: Optional[Dict[str, str]] = None,
    outputs: Optional[Dict[str, str]] = None,
    **kwargs: Any,
) -> Any:
    """``component_from_app(app, inputs, outputs)(*args, **kwargs)``: one task inside a pipeline."""
    return component_from_app(app, inputs, outputs)(*args, **kwargs)
