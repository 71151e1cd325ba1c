"""The AWS Batch request for an AppDef: a ``multinode`` job definition and the job using it.

Pure data building (no AWS calls): what ``aws_batch`` submits and shows in a dry run,
and the roles read back from a described job.

Secrets (``torchx.specs.secrets``) reach a job only by Batch's own mechanism: the
``secrets`` of its containers, each the ARN of a Secrets Manager secret or an SSM
parameter that Batch reads when a node starts (``-cfg secret_env=VAR:ARN``). A secret env
value given in clear (``HF_TOKEN=hf_...``, MLflow credentials torchx injects) is refused
with one line that says so: anyone who can describe a job definition reads its
``environment``, and a secret torchx created per job would outlive its job (no process
of torchx is there to delete it when the job ends).
"""

from __future__ import annotations

import getpass
import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum, auto
from typing import Any, Dict, List, Mapping, Optional, Tuple

import yaml

import torchx
from torchx.runtime.watchdog import unwrap, wrap
from torchx.schedulers.api import (
    IDEMPOTENCY_TOKEN,
    InvalidAppError,
    app_idempotency_token,
    app_stall_timeout,
)
from torchx.schedulers.devices import get_device_mounts
from torchx.schedulers.ids import random_id
from torchx.specs.api import (
    AppDef,
    BindMount,
    CfgVal,
    DeviceMount,
    InvalidRunConfigException,
    Resource,
    Role,
    macros,
)
from torchx.specs.secrets import secret_env

RANK0_ENV = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"
NODE_INDEX_ENV = "AWS_BATCH_JOB_NODE_INDEX"
ENV_TORCHX_ROLE_IDX = "TORCHX_ROLE_IDX"
ENV_TORCHX_ROLE_NAME = "TORCHX_ROLE_NAME"
TAG_TORCHX_VER = "torchx.pytorch.org/version"
TAG_TORCHX_APPNAME = "torchx.pytorch.org/app-name"
TAG_TORCHX_USER = "torchx.pytorch.org/user"
TAG_APP_ID = "torchx.pytorch.org/app-id"
DEFAULT_ROLE_NAME = "node"  # upstream 0.7.0's name
TAG_IDEMPOTENCY_TOKEN = "torchx.pytorch.org/idempotency-token"
MAX_NODE_RANGES = 5
MAX_ATTEMPTS = 10
K8S_ITYPE = "node.kubernetes.io/instance-type"
# what a container's ``secrets`` may name: a Secrets Manager secret or an SSM parameter
SECRET_ARN = re.compile(r"arn:aws[a-z-]*:(secretsmanager|ssm):[a-z0-9-]+:\d{12}:\S+")


@dataclass
class BatchJob:
    """What ``schedule`` sends: a job definition and the job that uses it."""

    name: str
    queue: str
    share_id: Optional[str]
    priority: int
    job_def: Dict[str, Any]
    # workspace image -> (image_repo, tag): built and pushed by ``schedule`` before submitting
    images_to_push: Dict[str, Tuple[str, str]] = field(default_factory=dict)

    @property
    def submit_args(self) -> Dict[str, Any]:
        args: Dict[str, Any] = {
            "jobName": self.name,
            "jobQueue": self.queue,
            "jobDefinition": self.job_def["jobDefinitionName"],
            "tags": dict(self.job_def["tags"]),
            "propagateTags": True,
        }
        if self.share_id:
            args["shareIdentifier"] = self.share_id
            args["schedulingPriorityOverride"] = self.priority
        return args

    def __str__(self) -> str:
        return yaml.safe_dump(
            {"registerJobDefinition": self.job_def, "submitJob": self.submit_args},
            sort_keys=False,
            width=1000,
        )

    __repr__ = __str__


def job_name(app_name: str) -> str:
    """``{name}-{random}``: Batch allows letters, digits, '-' and '_' (128 chars, alnum first)."""
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", app_name).strip("-_")[:100] or "app"
    return f"{base}-{random_id(8)}"


def resource_requirements_from_resource(resource: Resource) -> List[Dict[str, str]]:
    if resource.memMB <= 0:
        raise InvalidAppError(f"aws_batch needs memMB > 0 for every role, got {resource.memMB}")
    reqs = [
        {"type": "VCPU", "value": str(max(int(resource.cpu), 1))},
        {"type": "MEMORY", "value": str(int(resource.memMB))},
    ]
    if resource.gpu > 0:
        reqs.append({"type": "GPU", "value": str(int(resource.gpu))})
    return reqs


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


def resource_from_resource_requirements(resource_requirements: List[Dict[str, str]]) -> Resource:
    """The ``Resource`` back from Batch ``resourceRequirements`` (capabilities are not kept)."""
    reqs = {ResourceType.from_str(r["type"]): int(r["value"]) for r in resource_requirements}
    return Resource(
        cpu=reqs[ResourceType.VCPU],
        gpu=reqs.get(ResourceType.GPU, 0),
        memMB=reqs[ResourceType.MEMORY],
    )


def to_millis_since_epoch(ts: datetime) -> int:
    """Batch's timestamps are milliseconds since the epoch."""
    return int(round(ts.timestamp() * 1000))


def to_datetime(ms_since_epoch: int) -> datetime:
    return datetime.fromtimestamp(ms_since_epoch / 1000)


def _mounts(role: Role) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]], List[Dict[str, Any]]]:
    """(volumes, mountPoints, devices) of a role's mounts and resource devices."""
    perms = {"r": "READ", "w": "WRITE", "m": "MKNOD"}
    volumes: List[Dict[str, Any]] = []
    mount_points: List[Dict[str, Any]] = []
    devices: List[Dict[str, Any]] = []
    for i, mount in enumerate([*role.mounts, *get_device_mounts(role.resource.devices)]):
        name = f"mount_{i}"
        if isinstance(mount, DeviceMount):
            devices.append(
                {
                    "hostPath": mount.src_path,
                    "containerPath": mount.dst_path,
                    "permissions": [perms[p] for p in mount.permissions if p in perms],
                }
            )
            continue
        if isinstance(mount, BindMount):
            volumes.append({"name": name, "host": {"sourcePath": mount.src_path}})
        else:  # VolumeMount: an EFS file system
            volumes.append({"name": name, "efsVolumeConfiguration": {"fileSystemId": mount.src}})
        mount_points.append(
            {"containerPath": mount.dst_path, "readOnly": mount.read_only, "sourceVolume": name}
        )
    return volumes, mount_points, devices


def named_secrets(cfg: Mapping[str, CfgVal]) -> Dict[str, str]:
    """``-cfg secret_env=VAR:ARN;...`` as env var -> the ARN Batch reads its value from."""
    named = cfg.get("secret_env") or {}
    out = {str(var): str(arn) for var, arn in (named.items() if isinstance(named, dict) else [])}
    for var, arn in out.items():
        if not SECRET_ARN.fullmatch(arn):
            raise InvalidRunConfigException(
                f"secret_env {var}:{arn}: expected VAR:ARN, the ARN of a Secrets Manager secret"
                " (arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME) or an SSM parameter"
                " (arn:aws:ssm:REGION:ACCOUNT:parameter/NAME)",
                "secret_env",
                arn,
            )
    return out


def _refuse_clear_secrets(role: Role, env: Mapping[str, str]) -> None:
    """One line naming (never showing) the env values that hold a secret in clear."""
    clear = sorted(secret_env(env))
    if clear:
        raise InvalidAppError(
            f"role {role.name!r}: {', '.join(clear)} would hold a secret in the job"
            " definition's environment, which anyone who can describe it reads; store each in"
            " AWS Secrets Manager (or SSM Parameter Store) and pass its ARN instead:"
            f" -cfg secret_env={clear[0]}:arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME"
        )


def container_properties(
    role: Role, cfg: Mapping[str, CfgVal], stall_timeout: Optional[float] = None
) -> Dict[str, Any]:
    """A node range's container; with ``stall_timeout`` its command runs under
    ``torchx.runtime.watchdog`` (the image needs torchx), which judges node 0 only: nodes
    share no directory, and a rank that prints nothing while rank 0 prints is not stalled
    (node 0's stop ends the job). ``-cfg secret_env`` variables are ``secrets`` (they win
    over an env value of the same name); a secret in clear is refused."""
    volumes, mount_points, devices = _mounts(role)
    named = named_secrets(cfg)
    # as local, slurm and ray: prints reach CloudWatch at once (a block-buffered print loop
    # looks silent to stall detection), unless the role says otherwise
    env = {k: v for k, v in role.env.items() if k not in named}
    env.setdefault("PYTHONUNBUFFERED", "1")
    _refuse_clear_secrets(role, env)
    container: Dict[str, Any] = {
        "image": role.image,
        "command": wrap(
            [role.entrypoint, *role.args], stall_timeout, "--only-where", f"{NODE_INDEX_ENV}=0"
        ),
        "environment": [{"name": k, "value": v} for k, v in env.items()],
        "privileged": bool(cfg.get("privileged")),
        "resourceRequirements": resource_requirements_from_resource(role.resource),
        # PyTorch data loaders need more than Docker's 64 MB of /dev/shm.
        "linuxParameters": {"sharedMemorySize": int(role.resource.memMB), "devices": devices},
        "logConfiguration": {"logDriver": "awslogs"},
        "mountPoints": mount_points,
        "volumes": volumes,
    }
    if named:
        container["secrets"] = [{"name": k, "valueFrom": arn} for k, arn in named.items()]
    instance_type = role.resource.capabilities.get(K8S_ITYPE)
    if instance_type:
        container["instanceType"] = str(instance_type)
    if cfg.get("job_role_arn"):
        container["jobRoleArn"] = cfg["job_role_arn"]
    if cfg.get("execution_role_arn"):
        container["executionRoleArn"] = cfg["execution_role_arn"]
    return container


def keyed_definition(token: str) -> str:
    """The job definition every submission with ``token`` registers a revision of."""
    name = f"torchx-{token}"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}", name):
        raise InvalidAppError(
            f"idempotency token {token!r} cannot name an AWS Batch job definition;"
            " make it with torchx.schedulers.api.idempotency_token(key)"
        )
    return name


def batch_job(
    app: AppDef,
    cfg: Mapping[str, CfgVal],
    images_to_push: Optional[Dict[str, Tuple[str, str]]] = None,
) -> BatchJob:
    """The job definition (one node range per role, role 0 first) and job for ``app``;
    ``images_to_push`` (the workspace image, already rewritten in ``app``) rides along."""
    queue = str(cfg["queue"])
    name = job_name(app.name)
    app_id = f"{queue}:{name}"
    node_ranges = []
    start = 0
    for role_idx, role in enumerate(app.roles):
        replica_id = f"${NODE_INDEX_ENV}" if start == 0 else f"$(({NODE_INDEX_ENV}-{start}))"
        values = macros.Values(
            img_root="", app_id=app_id, replica_id=replica_id, rank0_env=RANK0_ENV
        )
        node_role = values.apply(role)
        node_role.env[ENV_TORCHX_ROLE_IDX] = str(role_idx)
        node_role.env[ENV_TORCHX_ROLE_NAME] = role.name
        node_ranges.append(
            {
                "targetNodes": f"{start}:{start + role.num_replicas - 1}",
                "container": container_properties(
                    node_role, cfg, app_stall_timeout(app) if start == 0 else None
                ),
            }
        )
        start += role.num_replicas
    tags = {
        TAG_TORCHX_VER: torchx.__version__,
        TAG_TORCHX_APPNAME: app.name,
        TAG_APP_ID: app_id,
        TAG_TORCHX_USER: str(cfg.get("user") or getpass.getuser()),
    }
    metadata = {str(k): str(v) for k, v in app.metadata.items() if k != IDEMPOTENCY_TOKEN}
    tags.update({k: v for k, v in metadata.items() if k not in secret_env(metadata)})
    token = app_idempotency_token(app)
    if token:
        tags[TAG_IDEMPOTENCY_TOKEN] = token
    retries = max(role.max_retries for role in app.roles)
    job_def: Dict[str, Any] = {
        "jobDefinitionName": keyed_definition(token) if token else name,
        "type": "multinode",
        "nodeProperties": {"numNodes": start, "mainNode": 0, "nodeRangeProperties": node_ranges},
        # attempts = first try + retries; a node exiting 0 never causes a retry
        "retryStrategy": {
            "attempts": min(1 + retries, MAX_ATTEMPTS),
            "evaluateOnExit": [{"onExitCode": "0", "action": "EXIT"}],
        },
        "platformCapabilities": ["EC2"],
        "propagateTags": True,
        "tags": tags,
    }
    priority = int(str(cfg.get("priority") or 0))
    if priority:
        job_def["schedulingPriority"] = priority
    share_id = cfg.get("share_id")
    return BatchJob(
        name=name,
        queue=queue,
        share_id=str(share_id) if share_id else None,
        priority=priority,
        job_def=job_def,
        images_to_push=dict(images_to_push or {}),
    )


def roles_of(job: Dict[str, Any]) -> List[Role]:
    """The roles of a described job, read back from its node ranges."""
    num_nodes = int((job.get("nodeProperties") or {}).get("numNodes") or 1)
    roles: List[Role] = []
    for node_range in (job.get("nodeProperties") or {}).get("nodeRangeProperties") or []:
        first, sep, last = str(node_range.get("targetNodes", "0:0")).partition(":")
        lo = int(first) if first else 0
        hi = (int(last) if last else num_nodes - 1) if sep else lo
        container = node_range.get("container") or {}
        env = {e["name"]: e["value"] for e in container.get("environment") or []}
        reqs = {r["type"]: int(r["value"]) for r in container.get("resourceRequirements") or []}
        command = unwrap(list(container.get("command") or []))
        roles.append(
            Role(
                name=env.get(ENV_TORCHX_ROLE_NAME, f"role{len(roles)}"),
                image=container.get("image", ""),
                entrypoint=command[0] if command else "",
                args=command[1:],
                env=env,
                num_replicas=hi - lo + 1,
                resource=Resource(
                    cpu=reqs.get("VCPU", 1),
                    gpu=reqs.get("GPU", 0),
                    memMB=reqs.get("MEMORY", -1),
                ),
            )
        )
    return roles
