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

GiB: int = 1024

# name: (module, attribute). builders/finder pull in argparse and docstring_parser,
# load_group importlib.metadata: each is imported on first use only.
_LAZY = {
    "materialize_appdef": ("torchx.specs.builders", "materialize_appdef"),
    "load_group": ("torchx.specs.plugins", "load_group"),
    "ComponentNotFoundException": ("torchx.specs.finder", "ComponentNotFoundException"),
    "ComponentValidationException": ("torchx.specs.finder", "ComponentValidationException"),
    "AWS_NAMED_RESOURCES": ("torchx.specs.named_resources_aws", "NAMED_RESOURCES"),
    "GENERIC_NAMED_RESOURCES": ("torchx.specs.named_resources_generic", "NAMED_RESOURCES"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'torchx.specs' has no attribute {name!r}")


__all__ = [
    "ALL",
    "AWS_NAMED_RESOURCES",
    "GENERIC_NAMED_RESOURCES",
    "GiB",
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
    "load_group",
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
