"""Single-replica AppDefs as KFP v2 container components.

A role's arguments may name typed inputs and outputs as KFP placeholders: ``${input:data}``,
``${output:model}`` (artifact paths) and ``${param:epochs}``. torchx macros get KFP's values
(``${app_id}`` is the task's id, ``${replica_id}`` is ``0``, ``$$`` a literal ``$``). KFP
does not substitute placeholders in env values, so those that need the task's identity
(the tracker's job id ``kfp://<job>/<task>``, ``${app_id}``) are exported by a ``sh -c``
prologue: the image needs ``sh`` then.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from torchx import IMAGE
from torchx.pipelines.kfp.image import base_image
from torchx.pipelines.kfp.resources import LauncherResources, set_task_resources
from torchx.specs.api import DEFAULT_RDZV_PORT, AppDef, InvalidArgumentError, Role
from torchx.specs.secrets import secret_env
from torchx.trackers.env import tracker_env
from torchx.util.modules import import_optional

# inputs every container component gets; make_task fills them
JOB_UUID, TASK_UUID, PARENT_RUN = "torchx_job_uuid", "torchx_task_uuid", "torchx_parent_run_id"
RANK0_ENV = "TORCHX_RANK0_HOST"

# $$, ${input:x} / ${output:x} / ${param:x}, ${macro} and $macro (string.Template's forms)
_TOKEN = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<kind>input|output|param):(?P<name>[A-Za-z_]\w*)\}"
    r"|\{(?P<braced>[_A-Za-z][_A-Za-z0-9]*)\}"
    r"|(?P<bare>[_A-Za-z][_A-Za-z0-9]*))"
)
_IO = {"input": "inputPath", "output": "outputPath", "param": "inputValue"}
_STATIC_MACROS = {
    "img_root": "",
    "base_img_root": "",
    "replica_id": "0",
    "rank0_env": RANK0_ENV,
    "rdzv_port": str(DEFAULT_RDZV_PORT),
}

Part = Union[str, Dict[str, Any]]


def _single_role(app: AppDef) -> Role:
    if len(app.roles) != 1 or app.roles[0].num_replicas != 1:
        raise InvalidArgumentError(
            f"app {app.name!r} has {len(app.roles)} role(s)"
            f" / {app.roles[0].num_replicas if app.roles else 0} replica(s);"
            " a KFP container component runs one process:"
            " use torchx_launcher for distributed or multi-role apps"
        )
    return app.roles[0]


def _parts(value: str, io: bool = True) -> List[Part]:
    """``value`` split into text and KFP placeholders (macros and, if ``io``, tokens)."""
    parts: List[Part] = []

    def text(s: str) -> None:
        if parts and isinstance(parts[-1], str):
            parts[-1] += s
        elif s:
            parts.append(s)

    pos = 0
    for m in _TOKEN.finditer(value):
        text(value[pos : m.start()])
        pos = m.end()
        macro = m.group("braced") or m.group("bare")
        if m.group("escaped"):
            text("$")
        elif m.group("kind") and io:
            parts.append({_IO[m.group("kind")]: m.group("name")})
        elif macro == "app_id":
            parts.append({"inputValue": TASK_UUID})
        elif macro in _STATIC_MACROS:
            text(_STATIC_MACROS[macro])
        else:  # not ours: left for the shell or the program
            text(m.group(0))
    text(value[pos:])
    return parts


def _joined(parts: List[Part]) -> Any:
    """One argument: a string, a placeholder, or KFP's ``concat`` of both."""
    if not parts:
        return ""
    if len(parts) == 1:
        return parts[0]
    return {"concat": parts}


def _job_id() -> Any:
    """``kfp://<pipeline job id>/<task id>``: an app handle (scheduler ``kfp``)."""
    return {"concat": ["kfp://", {"inputValue": JOB_UUID}, "/", {"inputValue": TASK_UUID}]}


def _command(entrypoint: Any, dynamic_env: Dict[str, Any]) -> List[Any]:
    """The container command: the entrypoint, after a ``sh -c`` prologue exporting env
    values KFP must fill at run time (it does not substitute placeholders in env)."""
    if not dynamic_env:
        return [entrypoint]
    names = list(dynamic_env)
    exports = " ".join(f'{n}="${i + 1}"' for i, n in enumerate(names))
    script = f'export {exports}; shift {len(names)}; exec "$@"'
    return ["sh", "-c", script, "torchx-kfp", *dynamic_env.values(), entrypoint]


def component_spec_from_app(
    app: AppDef,
    inputs: Optional[Dict[str, str]] = None,
    outputs: Optional[Dict[str, str]] = None,
    image: Optional[str] = None,
    trackers: Optional[Mapping[str, Optional[str]]] = None,
) -> Tuple[Dict[str, Any], Role]:
    """The component spec (as a dict) of a single-role app, and its role (arguments as for
    :func:`component_from_app`)."""
    role = _single_role(app)
    inputs, outputs = dict(inputs or {}), dict(outputs or {})
    reserved = {JOB_UUID, TASK_UUID, PARENT_RUN} & (set(inputs) | set(outputs))
    if reserved:
        raise InvalidArgumentError(
            f"app {app.name!r}: {sorted(reserved)} are torchx's own inputs; rename them"
        )
    used = {m.group("name") for a in role.args for m in _TOKEN.finditer(a) if m.group("kind")}
    missing = used - set(inputs) - set(outputs)
    if missing:
        raise InvalidArgumentError(
            f"app {app.name!r}: arguments use {sorted(missing)} but no inputs/outputs declare them"
        )
    if trackers is None:
        from torchx.runner.config import get_configured_trackers

        trackers = get_configured_trackers()
    static_env: Dict[str, str] = {}
    dynamic_env: Dict[str, Any] = {}
    task_env = {**role.env, **tracker_env(trackers)}
    if secret := sorted(secret_env(task_env)):  # the YAML is shared and read by anyone
        raise InvalidArgumentError(
            f"app {app.name!r}: env {secret[0]} holds a secret that the compiled pipeline"
            " would carry in clear; give it to the task from a Kubernetes Secret"
            " (kfp.kubernetes.use_secret_as_env) instead"
        )
    for name, value in task_env.items():
        joined = _joined(_parts(str(value), io=False))
        if isinstance(joined, str):  # no placeholder: the task sets it
            static_env[name] = joined
        else:
            dynamic_env[name] = joined
    static_env.setdefault(RANK0_ENV, "localhost")
    if trackers:
        dynamic_env["TORCHX_JOB_ID"] = _job_id()
        dynamic_env["TORCHX_PARENT_RUN_ID"] = {"inputValue": PARENT_RUN}
    command = _command(_joined(_parts(role.entrypoint, io=False)), dynamic_env)
    hidden = [
        {"name": JOB_UUID, "type": "String", "description": "KFP's pipeline job id"},
        {"name": TASK_UUID, "type": "String", "description": "KFP's task id (${app_id})"},
        {
            "name": PARENT_RUN,
            "type": "String",
            "default": "",
            "optional": True,
            "description": "the pipeline's tracker run (start_pipeline_run's output)",
        },
    ]
    spec = {
        "name": f"{app.name}-{role.name}",
        "description": f"torchx component {app.name}, role {role.name}",
        "inputs": [{"name": n, "type": t} for n, t in inputs.items()] + hidden,
        "outputs": [{"name": n, "type": t} for n, t in outputs.items()],
        "implementation": {
            "container": {
                "image": image or (base_image() if role.image == IMAGE else role.image),
                "command": command,
                "args": [_joined(_parts(a)) for a in role.args],
                "env": static_env,
            }
        },
    }
    return spec, role


def component_from_app(
    app: AppDef,
    inputs: Optional[Dict[str, str]] = None,
    outputs: Optional[Dict[str, str]] = None,
    image: Optional[str] = None,
    trackers: Optional[Mapping[str, Optional[str]]] = None,
) -> Any:
    """A KFP container component factory that runs a single-role, single-replica app.

    Calling the factory inside a pipeline makes a task that carries the role's resources
    (cpu, memory, gpu) and env; ``parent_run_id=`` (e.g. ``start_pipeline_run``'s output)
    nests the task's tracker run under the pipeline's. Distributed or multi-role apps
    need ``torchx_launcher``.

    Args:
        app: the app, e.g. ``utils.python(..., m="trainer.main")``; its role's args may
            hold ``${input:NAME}``, ``${output:NAME}`` and ``${param:NAME}`` tokens
        inputs: ``{NAME: type}`` of the tokens the app reads: an artifact type
            (``Dataset``, ``Model``, ``Metrics``, ``Artifact``) for ``${input:NAME}`` or a
            parameter type (``String``, ``Integer``, ``Float``) for ``${param:NAME}``
        outputs: ``{NAME: artifact type}`` of the ``${output:NAME}`` tokens
        image: the container image; default the role's, or ``$TORCHX_KFP_BASE_IMAGE``
            (see ``torchx.pipelines.kfp.image``) when the role keeps torchx's default image
        trackers: ``{tracker: config}`` the program's ``torchx.trackers`` calls report to
            (the config must be reachable from the pod, e.g. an http MLflow server);
            None: the configured trackers (``.torchxconfig`` / ``$TORCHX_TRACKERS``);
            ``{}``: no tracking
    """
    import yaml

    components = import_optional("kfp.components", "kfp")
    dsl = import_optional("kfp.dsl", "kfp")
    spec, role = component_spec_from_app(app, inputs, outputs, image, trackers)
    env = spec["implementation"]["container"].pop("env")
    factory = components.load_component_from_text(yaml.safe_dump(spec, sort_keys=False))

    def make_task(*args: Any, parent_run_id: Any = "", **kwargs: Any) -> Any:
        kwargs[JOB_UUID] = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        kwargs[TASK_UUID] = dsl.PIPELINE_TASK_ID_PLACEHOLDER
        kwargs[PARENT_RUN] = parent_run_id
        task = factory(*args, **kwargs)
        set_task_resources(task, LauncherResources(role.resource), memory_unit="M")
        for k, v in env.items():
            task.set_env_variable(k, v)
        task.set_display_name(spec["name"])
        return task

    make_task.component_spec = factory.component_spec  # type: ignore[attr-defined]
    make_task.__name__ = spec["name"].replace("-", "_")
    make_task.__doc__ = (
        f"A task running {spec['name']} ({spec['description']}); pass the declared"
        " inputs by name and parent_run_id= to nest its tracker run."
    )
    return make_task


def container_from_app(
    app: AppDef,
    *args: Any,
    inputs: Optional[Dict[str, str]] = None,
    outputs: Optional[Dict[str, str]] = None,
    image: Optional[str] = None,
    trackers: Optional[Mapping[str, Optional[str]]] = None,
    **kwargs: Any,
) -> Any:
    """``component_from_app(app, inputs, outputs, image, trackers)(*args, **kwargs)``: one
    task inside a pipeline (arguments as for :func:`component_from_app`)."""
    return component_from_app(app, inputs, outputs, image, trackers)(*args, **kwargs)
