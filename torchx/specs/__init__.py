"""The torchx data model: apps, roles, resources, states, run options and handles.

Importing this package is cheap: no entry-point scan, no optional dependency.
"""

from typing import Any

from torchx.specs.api import (
    ALL,
    MISSING,
    NONE,
    NULL_RESOURCE,
    AppDef,
    AppDryRunInfo,
    AppHandle,
    AppState,
    AppStatus,
    AppStatusError,
    BindMount,
    CfgVal,
    DeviceMount,
    InvalidArgumentError,
    InvalidRunConfigException,
    MalformedAppHandleException,
    MountType,
    ParsedAppHandle,
    ReplicaState,
    ReplicaStatus,
    Resource,
    RetryPolicy,
    Role,
    RoleStatus,
    TorchXError,
    UnknownAppException,
    UnknownSchedulerException,
    VolumeMount,
    get_type_name,
    is_started,
    is_terminal,
    macros,
    make_app_handle,
    parse_app_handle,
    parse_mounts,
    runopt,
    runopts,
)
from torchx.specs.named_resources import (
    NamedResourceNotFound,
    get_named_resources,
    named_resources,
    resource,
)

_LAZY = {
    "materialize_appdef": "torchx.specs.builders",
    "ComponentNotFoundException": "torchx.specs.finder",
    "ComponentValidationException": "torchx.specs.finder",
}


def __getattr__(name: str) -> Any:
    # builders/finder pull in argparse and docstring_parser: import them on first use only.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'torchx.specs' has no attribute {name!r}")


__all__ = [
    "ALL",
    "MISSING",
    "NONE",
    "NULL_RESOURCE",
    "AppDef",
    "AppDryRunInfo",
    "AppHandle",
    "AppState",
    "AppStatus",
    "AppStatusError",
    "BindMount",
    "CfgVal",
    "ComponentNotFoundException",
    "ComponentValidationException",
    "DeviceMount",
    "InvalidArgumentError",
    "InvalidRunConfigException",
    "MalformedAppHandleException",
    "MountType",
    "NamedResourceNotFound",
    "ParsedAppHandle",
    "ReplicaState",
    "ReplicaStatus",
    "Resource",
    "RetryPolicy",
    "Role",
    "RoleStatus",
    "TorchXError",
    "UnknownAppException",
    "UnknownSchedulerException",
    "VolumeMount",
    "get_named_resources",
    "get_type_name",
    "is_started",
    "is_terminal",
    "macros",
    "make_app_handle",
    "materialize_appdef",
    "named_resources",
    "parse_app_handle",
    "parse_mounts",
    "resource",
    "runopt",
    "runopts",
]
