"""Upstream ``torchx.schedulers.aws_batch_scheduler`` names that our request builder
(``aws_batch_request``) spells differently; re-exported by ``aws_batch_scheduler``."""

from __future__ import annotations

from datetime import datetime
from enum import Enum, auto
from typing import Dict, List

from torchx.schedulers.aws_batch_request import (
    TAG_APP_NAME,
    TAG_USER,
    TAG_VERSION,
    resource_requirements,
)
from torchx.specs.api import Resource

DEFAULT_ROLE_NAME = "node"
TAG_TORCHX_VER = TAG_VERSION
TAG_TORCHX_APPNAME = TAG_APP_NAME
TAG_TORCHX_USER = TAG_USER


def to_millis_since_epoch(ts: datetime) -> int:
    """Batch's timestamps are milliseconds since the epoch."""
    return int(round(ts.timestamp() * 1000))


def to_datetime(ms_since_epoch: int) -> datetime:
    return datetime.fromtimestamp(ms_since_epoch / 1000)


class ResourceType(Enum):
    """The ``type`` of a Batch ``resourceRequirements`` entry."""

    VCPU = auto()
    GPU = auto()
    MEMORY = auto()

    @staticmethod
    def from_str(resource_type: str) -> ResourceType:
        for rt in ResourceType:
            if rt.name == resource_type.upper():
                return rt
        raise ValueError(
            f"no ResourceType {resource_type!r}; valid: {', '.join(r.name for r in ResourceType)}"
        )


def resource_requirements_from_resource(resource: Resource) -> List[Dict[str, str]]:
    """Batch ``resourceRequirements`` for ``resource`` (VCPU >= 1, MEMORY in MB, GPU if any);
    a role without memory is an ``InvalidAppError`` (a ``ValueError``)."""
    return resource_requirements(resource)


def resource_from_resource_requirements(resource_requirements: List[Dict[str, str]]) -> Resource:
    """The ``Resource`` back from Batch ``resourceRequirements`` (capabilities are not kept)."""
    reqs = {ResourceType.from_str(r["type"]): int(r["value"]) for r in resource_requirements}
    return Resource(
        cpu=reqs[ResourceType.VCPU],
        gpu=reqs.get(ResourceType.GPU, 0),
        memMB=reqs[ResourceType.MEMORY],
    )
