"""AppDef <-> plain JSON-able dicts, so another process can read back what was submitted."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Dict, List, Union

from torchx.specs.api import (
    AppDef,
    BindMount,
    DeviceMount,
    Resource,
    RetryPolicy,
    Role,
    VolumeMount,
)

_MOUNT_TYPES = {"bind": BindMount, "volume": VolumeMount, "device": DeviceMount}
_MOUNT_KINDS = {cls: kind for kind, cls in _MOUNT_TYPES.items()}


def role_to_dict(role: Role) -> Dict[str, Any]:
    return {
        "name": role.name,
        "image": role.image,
        "min_replicas": role.min_replicas,
        "entrypoint": role.entrypoint,
        "args": list(role.args),
        "env": dict(role.env),
        "num_replicas": role.num_replicas,
        "max_retries": role.max_retries,
        "retry_policy": role.retry_policy.value,
        "resource": asdict(role.resource),
        "port_map": dict(role.port_map),
        "metadata": _jsonable(role.metadata),
        "mounts": [dict(asdict(m), type=_MOUNT_KINDS[type(m)]) for m in role.mounts],
    }


def role_from_dict(d: Dict[str, Any]) -> Role:
    d = dict(d)
    d["resource"] = Resource(**d["resource"])
    d["retry_policy"] = RetryPolicy(d["retry_policy"])
    mounts: List[Union[BindMount, VolumeMount, DeviceMount]] = []
    for m in d.get("mounts", []):
        m = dict(m)
        mounts.append(_MOUNT_TYPES[m.pop("type")](**m))
    d["mounts"] = mounts
    return Role(**d)


def appdef_to_dict(app: AppDef) -> Dict[str, Any]:
    return {
        "name": app.name,
        "roles": [role_to_dict(r) for r in app.roles],
        "metadata": dict(app.metadata),
    }


def appdef_from_dict(d: Dict[str, Any]) -> AppDef:
    return AppDef(
        name=d["name"],
        roles=[role_from_dict(r) for r in d["roles"]],
        metadata=d.get("metadata", {}),
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
