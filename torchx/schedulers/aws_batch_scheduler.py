"""``aws_batch``: run an app as an AWS Batch multi-node parallel (MNP) job.

Each submit registers a ``multinode`` job definition with one ``nodeRangeProperties``
entry per role (role 0 starts at node 0, the main node) and submits it to the
``queue`` runopt. Inside a node:

- ``${rank0_env}`` is ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS``; Batch sets it on
  every node except the main node itself, hence ``${...:=localhost}`` in dist.ddp;
- ``${replica_id}`` is ``$AWS_BATCH_JOB_NODE_INDEX`` (minus the role's first node for
  later roles): one node range serves all replicas of a role, so it is expanded by the
  shell at run time (dist.ddp runs through ``bash -c``);
- ``TORCHX_ROLE_IDX`` / ``TORCHX_ROLE_NAME`` name the node's role.

Batch has no elastic size: ``numNodes`` is the sum of ``num_replicas`` (the MAX of
``-j MIN:MAX``). App ids are ``{queue}:{job name}``; jobs are tagged
``torchx.pytorch.org/{version,app-name,app-id,user}`` plus the app's metadata, and
``list`` shows only jobs with those tags. ``describe`` reports each node's state (Batch's
node jobs ``{jobId}#{index}``), ``cancel`` terminates the job (reported as CANCELLED),
and ``log_iter`` reads (and tails) the node's CloudWatch log stream.
"""

from __future__ import annotations

import getpass
import logging
import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, TypedDict

import yaml

import torchx
from torchx.schedulers.api import (
    DescribeAppResponse,
    InvalidAppError,
    ListAppResponse,
    Scheduler,
    Stream,
    filter_regex,
)
from torchx.schedulers.ids import random_id
from torchx.specs.api import (
    NONE,
    AppDef,
    AppDryRunInfo,
    AppState,
    BindMount,
    CfgVal,
    DeviceMount,
    InvalidArgumentError,
    ReplicaStatus,
    Resource,
    Role,
    RoleStatus,
    TorchXError,
    VolumeMount,
    is_terminal,
    macros,
    runopts,
)
from torchx.util.modules import import_optional

logger = logging.getLogger(__name__)

RANK0_ENV = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"
NODE_INDEX_ENV = "AWS_BATCH_JOB_NODE_INDEX"
ENV_TORCHX_ROLE_IDX = "TORCHX_ROLE_IDX"
ENV_TORCHX_ROLE_NAME = "TORCHX_ROLE_NAME"
TAG_VERSION = "torchx.pytorch.org/version"
TAG_APP_NAME = "torchx.pytorch.org/app-name"
TAG_APP_ID = "torchx.pytorch.org/app-id"
TAG_USER = "torchx.pytorch.org/user"
DEFAULT_LOG_GROUP = "/aws/batch/job"
CANCEL_REASON = "cancelled by torchx"
MAX_NODE_RANGES = 5
MAX_ATTEMPTS = 10
TAIL_POLL_SECONDS = 1.0
K8S_ITYPE = "node.kubernetes.io/instance-type"
# resource.devices -> host device paths (one per unit), as upstream's device mounts
DEVICE_PATHS = {
    "vpc.amazonaws.com/efa": "/dev/infiniband/uverbs{}",
    "aws.amazon.com/neurondevice": "/dev/neuron{}",
}

JOB_STATE: Dict[str, AppState] = {
    "SUBMITTED": AppState.SUBMITTED,
    "PENDING": AppState.PENDING,
    "RUNNABLE": AppState.PENDING,
    "STARTING": AppState.PENDING,
    "RUNNING": AppState.RUNNING,
    "SUCCEEDED": AppState.SUCCEEDED,
    "FAILED": AppState.FAILED,
}


_LIVE = (AppState.SUBMITTED, AppState.PENDING, AppState.RUNNING)


class AWSBatchOpts(TypedDict, total=False):
    queue: str
    user: str
    privileged: bool
    share_id: Optional[str]
    priority: int
    job_role_arn: Optional[str]
    execution_role_arn: Optional[str]
    image_repo: Optional[str]
    quiet: bool


class AWSBatchError(TorchXError):
    """AWS refused a request or is not configured (the message says what to do)."""


@dataclass
class BatchJob:
    """What ``schedule`` sends: a job definition and the job that uses it."""

    name: str
    queue: str
    share_id: Optional[str]
    priority: int
    job_def: Dict[str, Any]

    @property
    def submit_args(self) -> Dict[str, Any]:
        args: Dict[str, Any] = {
            "jobName": self.name,
            "jobQueue": self.queue,
            "jobDefinition": self.name,
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


def parse_app_id(app_id: str) -> Tuple[str, str]:
    queue, sep, name = app_id.partition(":")
    if not sep or not queue or not name:
        raise InvalidArgumentError(
            f"{app_id!r} is not an aws_batch app id; expected QUEUE:JOB_NAME"
        )
    return queue, name


def job_name(app_name: str) -> str:
    """``{name}-{random}``: Batch allows letters, digits, '-' and '_' (128 chars, alnum first)."""
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", app_name).strip("-_")[:100] or "app"
    return f"{base}-{random_id(8)}"


def resource_requirements(resource: Resource) -> List[Dict[str, str]]:
    if resource.memMB <= 0:
        raise InvalidAppError(f"aws_batch needs memMB > 0 for every role, got {resource.memMB}")
    reqs = [
        {"type": "VCPU", "value": str(max(int(resource.cpu), 1))},
        {"type": "MEMORY", "value": str(int(resource.memMB))},
    ]
    if resource.gpu > 0:
        reqs.append({"type": "GPU", "value": str(int(resource.gpu))})
    return reqs


def _mounts(role: Role) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]], List[Dict[str, Any]]]:
    """(volumes, mountPoints, devices) of a role's mounts and resource devices."""
    perms = {"r": "READ", "w": "WRITE", "m": "MKNOD"}
    volumes: List[Dict[str, Any]] = []
    mount_points: List[Dict[str, Any]] = []
    devices: List[Dict[str, Any]] = []
    mounts = list(role.mounts)
    for device, count in role.resource.devices.items():
        if device in DEVICE_PATHS:
            mounts += [
                DeviceMount(DEVICE_PATHS[device].format(i), DEVICE_PATHS[device].format(i))
                for i in range(count)
            ]
    for i, mount in enumerate(mounts):
        name = f"mount_{i}"
        if isinstance(mount, BindMount):
            volumes.append({"name": name, "host": {"sourcePath": mount.src_path}})
            mount_points.append(
                {"containerPath": mount.dst_path, "readOnly": mount.read_only, "sourceVolume": name}
            )
        elif isinstance(mount, VolumeMount):
            volumes.append({"name": name, "efsVolumeConfiguration": {"fileSystemId": mount.src}})
            mount_points.append(
                {"containerPath": mount.dst_path, "readOnly": mount.read_only, "sourceVolume": name}
            )
        elif isinstance(mount, DeviceMount):
            devices.append(
                {
                    "hostPath": mount.src_path,
                    "containerPath": mount.dst_path,
                    "permissions": [perms[p] for p in mount.permissions if p in perms],
                }
            )
    return volumes, mount_points, devices


def container_properties(role: Role, cfg: Mapping[str, CfgVal]) -> Dict[str, Any]:
    volumes, mount_points, devices = _mounts(role)
    container: Dict[str, Any] = {
        "image": role.image,
        "command": [role.entrypoint, *role.args],
        "environment": [{"name": k, "value": v} for k, v in role.env.items()],
        "privileged": bool(cfg.get("privileged")),
        "resourceRequirements": resource_requirements(role.resource),
        # PyTorch data loaders need more than Docker's 64 MB of /dev/shm.
        "linuxParameters": {"sharedMemorySize": int(role.resource.memMB), "devices": devices},
        "logConfiguration": {"logDriver": "awslogs"},
        "mountPoints": mount_points,
        "volumes": volumes,
    }
    instance_type = role.resource.capabilities.get(K8S_ITYPE)
    if instance_type:
        container["instanceType"] = str(instance_type)
    if cfg.get("job_role_arn"):
        container["jobRoleArn"] = cfg["job_role_arn"]
    if cfg.get("execution_role_arn"):
        container["executionRoleArn"] = cfg["execution_role_arn"]
    return container


def _error_text(job: Dict[str, Any]) -> str:
    """Why a job or node failed, from its status reason and last container state."""
    parts = []
    if job.get("statusReason"):
        parts.append(str(job["statusReason"]))
    container = job.get("container") or {}
    attempts = job.get("attempts") or []
    if attempts:
        container = {**container, **(attempts[-1].get("container") or {})}
    if container.get("reason"):
        parts.append(str(container["reason"]))
    if container.get("exitCode") not in (None, 0):
        parts.append(f"exit code {container['exitCode']}")
    return "; ".join(parts)


class AWSBatchScheduler(Scheduler[BatchJob]):
    """Submits, describes, tails and terminates multi-node parallel jobs on AWS Batch."""

    def __init__(
        self,
        session_name: str,
        client: Optional[Any] = None,
        log_client: Optional[Any] = None,
        log_group: str = DEFAULT_LOG_GROUP,
    ) -> None:
        super().__init__("aws_batch", session_name)
        self._client = client
        self._log_client = log_client
        self._log_group = log_group

    # ------------------------------------------------------------------ clients

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self._boto_client("batch")
        return self._client

    @property
    def log_client(self) -> Any:
        if self._log_client is None:
            self._log_client = self._boto_client("logs")
        return self._log_client

    @staticmethod
    def _boto_client(service: str) -> Any:
        boto3 = import_optional("boto3", "aws_batch")
        from botocore.exceptions import NoRegionError

        try:
            return boto3.client(service)
        except NoRegionError:
            raise AWSBatchError(
                "no AWS region configured; set AWS_DEFAULT_REGION (or `aws configure`)"
            ) from None

    def _call(self, client: Any, method: str, **kwargs: Any) -> Any:
        """One AWS API call; client-side and service errors become one-line AWSBatchErrors."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(client, method)(**kwargs)
        except ClientError as e:
            err = e.response.get("Error", {})
            raise AWSBatchError(
                f"AWS Batch {method} failed: {err.get('Code')}: {err.get('Message')}"
            ) from None
        except BotoCoreError as e:
            raise AWSBatchError(f"AWS {method} failed: {e}") from None

    # ------------------------------------------------------------------ submit

    def _run_opts(self) -> runopts:
        opts = runopts()
        opts.add("queue", type_=str, required=True, help="the AWS Batch job queue to submit to")
        opts.add(
            "user", type_=str, default=getpass.getuser(), help="the user name to tag the job with"
        )
        opts.add(
            "privileged", type_=bool, default=False, help="run the containers in privileged mode"
        )
        opts.add("share_id", type_=str, help="the share identifier of a fair-share job queue")
        opts.add(
            "priority",
            type_=int,
            default=0,
            help="scheduling priority in a fair-share queue (with share_id)",
        )
        opts.add("job_role_arn", type_=str, help="IAM role the containers' AWS calls use")
        opts.add(
            "execution_role_arn", type_=str, help="IAM role ECS uses to pull images and write logs"
        )
        opts.add(
            "image_repo",
            type_=str,
            help="repository for workspace images (accepted for compatibility)",
        )
        opts.add(
            "quiet",
            type_=bool,
            default=False,
            help="accepted for compatibility (image push progress)",
        )
        return opts

    def _validate(self, app: AppDef, scheduler: str, cfg: Mapping[str, CfgVal]) -> None:
        super()._validate(app, scheduler, cfg)
        if len(app.roles) > MAX_NODE_RANGES:
            raise InvalidAppError(
                f"aws_batch runs at most {MAX_NODE_RANGES} roles (node ranges) per job,"
                f" app has {len(app.roles)}"
            )

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[BatchJob]:
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
                    "container": container_properties(node_role, cfg),
                }
            )
            start += role.num_replicas
        tags = {
            TAG_VERSION: torchx.__version__,
            TAG_APP_NAME: app.name,
            TAG_APP_ID: app_id,
            TAG_USER: str(cfg.get("user") or getpass.getuser()),
        }
        tags.update({str(k): str(v) for k, v in app.metadata.items()})
        retries = max(role.max_retries for role in app.roles)
        job_def: Dict[str, Any] = {
            "jobDefinitionName": name,
            "type": "multinode",
            "nodeProperties": {
                "numNodes": start,
                "mainNode": 0,
                "nodeRangeProperties": node_ranges,
            },
            # attempts = first try + retries; a node exiting 0 never causes a retry
            "retryStrategy": {
                "attempts": min(1 + retries, MAX_ATTEMPTS),
                "evaluateOnExit": [{"onExitCode": "0", "action": "EXIT"}],
            },
            "platformCapabilities": ["EC2"],
            "propagateTags": True,
            "tags": tags,
        }
        priority = int(cfg.get("priority") or 0)  # type: ignore[arg-type]
        if priority:
            job_def["schedulingPriority"] = priority
        share_id = cfg.get("share_id")
        req = BatchJob(
            name=name,
            queue=queue,
            share_id=str(share_id) if share_id else None,
            priority=priority,
            job_def=job_def,
        )
        return AppDryRunInfo(req, str)

    def schedule(self, dryrun_info: AppDryRunInfo[BatchJob]) -> str:
        req = dryrun_info.request
        self._call(self.client, "register_job_definition", **req.job_def)
        self._call(self.client, "submit_job", **req.submit_args)
        return f"{req.queue}:{req.name}"

    # ------------------------------------------------------------------ describe

    def _describe_jobs(self, ids: List[str]) -> List[Dict[str, Any]]:
        jobs: List[Dict[str, Any]] = []
        for i in range(0, len(ids), 100):
            jobs += (
                self._call(self.client, "describe_jobs", jobs=ids[i : i + 100]).get("jobs") or []
            )
        return jobs

    def _get_job(self, app_id: str) -> Optional[Dict[str, Any]]:
        queue, name = parse_app_id(app_id)
        summaries = (
            self._call(
                self.client,
                "list_jobs",
                jobQueue=queue,
                filters=[{"name": "JOB_NAME", "values": [name]}],
            ).get("jobSummaryList")
            or []
        )
        summaries = [
            s for s in summaries if s.get("jobName") == name and "#" not in s.get("jobId", "")
        ]
        if not summaries:
            return None
        newest = max(summaries, key=lambda s: s.get("createdAt") or 0)
        jobs = self._describe_jobs([newest["jobId"]])
        return jobs[0] if jobs else None

    def _node_jobs(self, job: Dict[str, Any]) -> Dict[int, Dict[str, Any]]:
        """Batch's per-node jobs (``{jobId}#{index}``); absent until the job starts."""
        num_nodes = int((job.get("nodeProperties") or {}).get("numNodes") or 0)
        ids = [f"{job['jobId']}#{i}" for i in range(num_nodes)]
        out = {}
        for node in self._describe_jobs(ids) if ids else []:
            _, _, index = node.get("jobId", "").partition("#")
            if index.isdigit():
                out[int(index)] = node
        return out

    def _state(self, job: Dict[str, Any]) -> AppState:
        state = JOB_STATE.get(job.get("status", ""), AppState.UNKNOWN)
        if state == AppState.FAILED and str(job.get("statusReason", "")).startswith(CANCEL_REASON):
            return AppState.CANCELLED
        return state

    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        job = self._get_job(app_id)
        if job is None:
            return None
        state = self._state(job)
        nodes = self._node_jobs(job)
        roles = self._roles(job)
        statuses = []
        start = 0
        for role in roles:
            replicas = []
            for i in range(role.num_replicas):
                node = nodes.get(start + i)
                if node is None:  # no node job (yet): the node is where the job is
                    r_state, host, err = (
                        state,
                        "",
                        _error_text(job) if state == AppState.FAILED else "",
                    )
                else:
                    r_state = self._state(node)
                    if state == AppState.CANCELLED and r_state in (AppState.FAILED, *_LIVE):
                        r_state = AppState.CANCELLED  # terminated with the job
                    interfaces = ((node.get("container") or {}).get("networkInterfaces")) or []
                    host = interfaces[0].get("privateIpv4Address", "") if interfaces else ""
                    err = _error_text(node) if r_state == AppState.FAILED else ""
                replicas.append(ReplicaStatus(i, r_state, role.name, host, err or NONE))
            statuses.append(RoleStatus(role.name, replicas))
            start += role.num_replicas
        msg = (
            _error_text(job)
            if state in (AppState.FAILED, AppState.CANCELLED)
            else str(job.get("statusReason") or "")
        )
        region = self.client.meta.region_name
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            num_restarts=max(len(job.get("attempts") or []) - 1, 0),
            msg=msg or NONE,
            ui_url=f"https://{region}.console.aws.amazon.com/batch/home?region={region}#jobs/mnp-job/{job['jobId']}",
            metadata={k: v for k, v in (job.get("tags") or {}).items()},
            roles_statuses=statuses,
            roles=roles,
        )

    @staticmethod
    def _roles(job: Dict[str, Any]) -> List[Role]:
        num_nodes = int((job.get("nodeProperties") or {}).get("numNodes") or 1)
        roles: List[Role] = []
        for node_range in (job.get("nodeProperties") or {}).get("nodeRangeProperties") or []:
            first, sep, last = str(node_range.get("targetNodes", "0:0")).partition(":")
            lo = int(first) if first else 0
            hi = (int(last) if last else num_nodes - 1) if sep else lo
            container = node_range.get("container") or {}
            env = {e["name"]: e["value"] for e in container.get("environment") or []}
            reqs = {r["type"]: int(r["value"]) for r in container.get("resourceRequirements") or []}
            command = list(container.get("command") or [])
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

    # ------------------------------------------------------------------ list / cancel

    def list(self) -> List[ListAppResponse]:
        """torchx jobs (found by their tags) in every job queue, in all states."""
        apps = []
        queues = [
            q["jobQueueName"]
            for q in self._call(self.client, "describe_job_queues").get("jobQueues") or []
        ]
        for queue in queues:
            summaries = []
            token: Optional[str] = None
            while True:
                kwargs: Dict[str, Any] = {
                    "jobQueue": queue,
                    "filters": [{"name": "AFTER_CREATED_AT", "values": ["1"]}],
                }
                if token:
                    kwargs["nextToken"] = token
                resp = self._call(self.client, "list_jobs", **kwargs)
                summaries += [
                    s for s in resp.get("jobSummaryList") or [] if "#" not in s.get("jobId", "")
                ]
                token = resp.get("nextToken")
                if not token:
                    break
            for job in self._describe_jobs([s["jobId"] for s in summaries]):
                tags = job.get("tags") or {}
                if TAG_VERSION in tags:
                    apps.append(
                        ListAppResponse(
                            f"{queue}:{job['jobName']}",
                            self._state(job),
                            name=tags.get(TAG_APP_NAME, ""),
                        )
                    )
        return apps

    def _cancel_existing(self, app_id: str) -> None:
        job = self._get_job(app_id)
        if job is not None:
            self._call(self.client, "terminate_job", jobId=job["jobId"], reason=CANCEL_REASON)

    # ------------------------------------------------------------------ logs

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: Optional[str] = None,
        since: Optional[datetime] = None,
        until: Optional[datetime] = None,
        should_tail: bool = False,
        streams: Optional[Stream] = None,
    ) -> Iterable[str]:
        """Lines of node ``k`` of ``role_name`` from CloudWatch Logs (stdout and stderr)."""
        if streams not in (None, Stream.COMBINED):
            raise InvalidArgumentError(
                "aws_batch logs combine stdout and stderr; use --streams combined (the default)"
            )
        return filter_regex(regex, self._log_lines(app_id, role_name, k, since, until, should_tail))

    def _node_index(self, job: Dict[str, Any], role_name: str, k: int) -> int:
        start = 0
        for role in self._roles(job):
            if role.name == role_name:
                if not 0 <= k < role.num_replicas:
                    raise InvalidArgumentError(
                        f"role {role_name!r} has replicas 0..{role.num_replicas - 1}, not {k}"
                    )
                return start + k
            start += role.num_replicas
        raise InvalidArgumentError(f"app has no role {role_name!r}")

    def _log_stream(self, job: Dict[str, Any], node_index: int) -> Optional[str]:
        candidates = self._describe_jobs([f"{job['jobId']}#{node_index}"])
        if not candidates and node_index == int(
            (job.get("nodeProperties") or {}).get("mainNode") or 0
        ):
            candidates = [job]  # without node jobs, the job's own stream is the main node's
        for node in candidates:
            attempts = node.get("attempts") or []
            for container in [
                (attempts[-1].get("container") if attempts else None),
                node.get("container"),
            ]:
                if container and container.get("logStreamName"):
                    return str(container["logStreamName"])
        return None

    def _log_lines(
        self,
        app_id: str,
        role_name: str,
        k: int,
        since: Optional[datetime],
        until: Optional[datetime],
        should_tail: bool,
    ) -> Iterator[str]:
        job = self._get_job(app_id)
        if job is None:
            return
        node_index = self._node_index(job, role_name, k)
        kwargs: Dict[str, Any] = {"logGroupName": self._log_group, "startFromHead": True}
        if since is not None:
            kwargs["startTime"] = int(since.timestamp() * 1000)
        if until is not None:
            kwargs["endTime"] = int(until.timestamp() * 1000)
        stream: Optional[str] = None
        token: Optional[str] = None
        ended = False
        while True:
            if stream is None:
                stream = self._log_stream(job, node_index)
            if stream is not None:
                while True:  # drain what is there now
                    args = dict(
                        kwargs, logStreamName=stream, **({"nextToken": token} if token else {})
                    )
                    resp = self._call(self.log_client, "get_log_events", **args)
                    events = resp.get("events") or []
                    for event in events:
                        message = str(event.get("message", ""))
                        yield message if message.endswith("\n") else message + "\n"
                    new_token = resp.get("nextForwardToken")
                    done = (
                        new_token is None or new_token == token
                    )  # AWS: same token = end of stream
                    token = new_token
                    if done:
                        break
            if not should_tail or ended:
                return
            job = self._get_job(app_id) or job
            if is_terminal(self._state(job)):
                ended = True  # read once more: lines written just before the end
                continue
            time.sleep(TAIL_POLL_SECONDS)


def create_scheduler(
    session_name: str, client: Optional[Any] = None, log_client: Optional[Any] = None, **kwargs: Any
) -> AWSBatchScheduler:
    return AWSBatchScheduler(
        session_name,
        client=client,
        log_client=log_client,
        log_group=kwargs.get("log_group", DEFAULT_LOG_GROUP),
    )
