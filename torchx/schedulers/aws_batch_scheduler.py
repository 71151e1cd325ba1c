"""``aws_batch``: run an app as an AWS Batch multi-node parallel (MNP) job.

One ``multinode`` job definition per submit, one node range per role (role 0 holds node 0,
the main node). Batch sets ``${rank0_env}`` on every node but the main one (hence
``${...:=localhost}`` in dist.ddp), and one node range serves all replicas of a role, so
``${replica_id}`` is ``$AWS_BATCH_JOB_NODE_INDEX`` expanded by the node's shell. Batch has
no elastic size: ``numNodes`` is the sum of ``num_replicas``.

App ids are ``{queue}:{job name}``; ``list`` shows the jobs torchx tagged. A keyed
submission registers a revision of the job definition ``torchx-{token}``, so
``find_by_idempotency_token`` filters on the service side (ListJobs cannot filter on tags).
A workspace image is built and pushed (``DockerWorkspaceMixin``) before anything is
registered. Secrets reach the job by ARN only, as the containers' ``secrets``
(``-cfg secret_env=VAR:ARN``); a secret env value in clear is refused
(``aws_batch_request``).
"""

from __future__ import annotations

import getpass
import logging
import time
from datetime import datetime
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Tuple,
    TypedDict,
)

from torchx.runtime.watchdog import STALLED_EXIT, stall_reason_in
from torchx.schedulers.api import (
    DescribeAppResponse,
    InvalidAppError,
    ListAppResponse,
    Scheduler,
    Stream,
    filter_regex,
)
from torchx.schedulers.aws_batch_request import (  # noqa: F401 (upstream's names)
    DEFAULT_ROLE_NAME,
    ENV_TORCHX_ROLE_IDX,
    ENV_TORCHX_ROLE_NAME,
    MAX_NODE_RANGES,
    TAG_IDEMPOTENCY_TOKEN,
    TAG_TORCHX_APPNAME,
    TAG_TORCHX_USER,
    TAG_TORCHX_VER,
    BatchJob,
    ResourceType,
    batch_job,
    keyed_definition,
    named_secrets,
    resource_from_resource_requirements,
    resource_requirements_from_resource,
    roles_of,
    to_datetime,
    to_millis_since_epoch,
)
from torchx.specs.api import (
    NONE,
    AppDef,
    AppDryRunInfo,
    AppState,
    CfgVal,
    InvalidArgumentError,
    ReplicaStatus,
    RoleStatus,
    TorchXError,
    is_terminal,
    runopts,
)
from torchx.util.modules import import_optional
from torchx.workspace.docker_workspace import DockerWorkspaceMixin

if TYPE_CHECKING:
    from docker import DockerClient

logger = logging.getLogger(__name__)

DEFAULT_LOG_GROUP = "/aws/batch/job"
CANCEL_REASON = "cancelled by torchx"
TAIL_POLL_SECONDS = 1.0
FIND_MAX_JOBS = 1000  # per queue: a bound on find_by_idempotency_token's scan

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
    secret_env: Optional[Dict[str, str]]


class AWSBatchError(TorchXError):
    """AWS refused a request or is not configured (the message says what to do)."""


def parse_app_id(app_id: str) -> Tuple[str, str]:
    queue, sep, name = app_id.partition(":")
    if not sep or not queue or not name:
        raise InvalidArgumentError(
            f"{app_id!r} is not an aws_batch app id; expected QUEUE:JOB_NAME"
        )
    return queue, name


def _container(job: Dict[str, Any]) -> Dict[str, Any]:
    """A job's or node's last container state."""
    container = job.get("container") or {}
    attempts = job.get("attempts") or []
    return {**container, **(attempts[-1].get("container") or {})} if attempts else container


def _error_text(job: Dict[str, Any]) -> str:
    """Why a job or node failed, from its status reason and last container state."""
    parts = []
    if job.get("statusReason"):
        parts.append(str(job["statusReason"]))
    container = _container(job)
    if container.get("reason"):
        parts.append(str(container["reason"]))
    if container.get("exitCode") not in (None, 0):
        parts.append(f"exit code {container['exitCode']}")
    return "; ".join(parts)


class AWSBatchScheduler(DockerWorkspaceMixin, Scheduler[BatchJob]):
    """Submits, describes, tails and terminates multi-node parallel jobs on AWS Batch."""

    def __init__(
        self,
        session_name: str,
        client: Optional[Any] = None,
        log_client: Optional[Any] = None,
        docker_client: Optional[DockerClient] = None,  # upstream's positional order
        log_group: str = DEFAULT_LOG_GROUP,
    ) -> None:
        super().__init__("aws_batch", session_name, docker_client=docker_client)
        self._client = client
        self._log_client = log_client
        self._log_group = log_group

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

    def _call(self, api: Callable[..., Any], **kwargs: Any) -> Any:
        """One AWS API call (a boto3 client's method); client-side and service errors become
        one-line AWSBatchErrors."""
        from botocore.exceptions import BotoCoreError, ClientError

        method = api.__name__  # boto3 names each method after its operation
        try:
            return api(**kwargs)
        except ClientError as e:
            err = e.response.get("Error", {})
            raise AWSBatchError(
                f"AWS Batch {method} failed: {err.get('Code')}: {err.get('Message')}"
            ) from None
        except BotoCoreError as e:
            raise AWSBatchError(f"AWS {method} failed: {e}") from None

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
            "execution_role_arn",
            type_=str,
            help="IAM role ECS uses to pull images, write logs and read secret_env's secrets",
        )
        opts.add(
            "secret_env",
            type_=Dict[str, str],
            help="env vars Batch sets from AWS Secrets Manager or SSM Parameter Store, VAR:ARN"
            " separated by ';', e.g. HF_TOKEN:arn:aws:secretsmanager:us-east-1:123456789012:"
            "secret:hf (execution_role_arn's role must be allowed to read them); a secret env"
            " value in clear (HF_TOKEN=hf_..., MLflow credentials) is refused: name it here",
        )
        return opts

    def _validate(
        self, app: AppDef, scheduler: str, cfg: Optional[Mapping[str, CfgVal]] = None
    ) -> None:
        super()._validate(app, scheduler, cfg)
        if len(app.roles) > MAX_NODE_RANGES:
            raise InvalidAppError(
                f"aws_batch runs at most {MAX_NODE_RANGES} roles (node ranges) per job,"
                f" app has {len(app.roles)}"
            )
        named_secrets(cfg or {})

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[BatchJob]:
        images_to_push = self.dryrun_push_images(app, cfg)  # workspace image -> image_repo:digest
        return AppDryRunInfo(batch_job(app, cfg, images_to_push), str)

    def schedule(self, dryrun_info: AppDryRunInfo[BatchJob]) -> str:
        self.push_images(dryrun_info.request.images_to_push)
        req = dryrun_info.request
        self._call(self.client.register_job_definition, **req.job_def)
        self._call(self.client.submit_job, **req.submit_args)
        return f"{req.queue}:{req.name}"

    def _describe_jobs(self, ids: List[str]) -> List[Dict[str, Any]]:
        jobs: List[Dict[str, Any]] = []
        for i in range(0, len(ids), 100):
            jobs += self._call(self.client.describe_jobs, jobs=ids[i : i + 100]).get("jobs") or []
        return jobs

    def _get_job(self, app_id: str) -> Optional[Dict[str, Any]]:
        queue, name = parse_app_id(app_id)
        jobs = self._list_jobs(queue, {"name": "JOB_NAME", "values": [name]})
        named = [job for job in jobs if job.get("jobName") == name]
        return max(named, key=lambda job: job.get("createdAt") or 0, default=None)

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
        roles = roles_of(job)
        statuses = []
        start = 0
        for role in roles:
            replicas = []
            for i in range(role.num_replicas):
                node = nodes.get(start + i)  # None: no node job (yet), the node is the job's
                r_state = state if node is None else self._state(node)
                if state == AppState.CANCELLED and r_state in (AppState.FAILED, *_LIVE):
                    r_state = AppState.CANCELLED  # terminated with the job
                interfaces = ((node or {}).get("container") or {}).get("networkInterfaces") or []
                host = interfaces[0].get("privateIpv4Address", "") if interfaces else ""
                err = _error_text(node or job) if r_state == AppState.FAILED else ""
                replicas.append(ReplicaStatus(i, r_state, role.name, host, err or NONE))
            statuses.append(RoleStatus(role.name, replicas))
            start += role.num_replicas
        msg = (
            _error_text(job)
            if state in (AppState.FAILED, AppState.CANCELLED)
            else str(job.get("statusReason") or "")
        )
        if state == AppState.FAILED:
            msg = self._stall_reason(job, nodes) or msg
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

    def list(self) -> List[ListAppResponse]:
        """torchx jobs (found by their tags) in every job queue, in all states."""
        apps = []
        for queue in self._queues():
            # AFTER_CREATED_AT=1: a filter makes ListJobs return every state, not just RUNNING
            for job in self._list_jobs(queue, {"name": "AFTER_CREATED_AT", "values": ["1"]}):
                if TAG_TORCHX_VER in (job.get("tags") or {}):
                    apps.append(self._entry(queue, job))
        return apps

    def find_by_idempotency_token(
        self, token: str, cfg: Optional[Mapping[str, CfgVal]] = None
    ) -> List[ListAppResponse]:
        """Jobs tagged with ``token`` in every queue, oldest first (``createdAt``, app id).
        Batch has no claim: racing losers are cancelled once submitted (one that reached
        RUNNING may start its command); two within ListJobs' consistency lag may both stay."""
        flt = {"name": "JOB_DEFINITION", "values": [keyed_definition(token)]}
        found = []
        for queue in self._queues():
            for job in self._list_jobs(queue, flt, limit=FIND_MAX_JOBS):
                tags = job.get("tags") or {}
                if TAG_TORCHX_VER in tags and tags.get(TAG_IDEMPOTENCY_TOKEN) == token:
                    found.append((int(job.get("createdAt") or 0), self._entry(queue, job)))
        found.sort(key=lambda pair: (pair[0], pair[1].app_id))
        return [entry for _, entry in found]

    def _entry(self, queue: str, job: Dict[str, Any]) -> ListAppResponse:
        name = (job.get("tags") or {}).get(TAG_TORCHX_APPNAME, "")
        return ListAppResponse(f"{queue}:{job['jobName']}", self._state(job), name=name)

    def _pages(
        self, api: Callable[..., Any], key: str, limit: Optional[int] = None, **kwargs: Any
    ) -> List[Dict[str, Any]]:
        """The items under ``key`` of every page of a paginated AWS call (about ``limit``)."""
        items: List[Dict[str, Any]] = []
        token: Optional[str] = None
        while limit is None or len(items) < limit:
            resp = self._call(api, **kwargs, **({"nextToken": token} if token else {}))
            items += resp.get(key) or []
            token = resp.get("nextToken")
            if not token:
                break
        return items

    def _queues(self) -> List[str]:
        queues = self._pages(self.client.describe_job_queues, "jobQueues")
        return [q["jobQueueName"] for q in queues]

    def _list_jobs(
        self, queue: str, flt: Dict[str, Any], limit: Optional[int] = None
    ) -> List[Dict[str, Any]]:
        """Described (main, not node) jobs of ``queue`` that ListJobs' filter ``flt`` returns."""
        summaries = self._pages(
            self.client.list_jobs, "jobSummaryList", limit, jobQueue=queue, filters=[flt]
        )
        ids = [s["jobId"] for s in summaries if "#" not in s.get("jobId", "")]
        return self._describe_jobs(ids if limit is None else ids[:limit])

    def _cancel_existing(self, app_id: str) -> None:
        job = self._get_job(app_id)
        if job is not None:
            self._call(self.client.terminate_job, jobId=job["jobId"], reason=CANCEL_REASON)

    def _stall_reason(self, job: Dict[str, Any], nodes: Dict[int, Dict[str, Any]]) -> str:
        """The reason the watchdog left as its last log line, for the first node that ended
        with its exit code; "" if none did or the log cannot be read."""
        for index, node in sorted((nodes or {0: job}).items()):
            if _container(node).get("exitCode") != STALLED_EXIT:
                continue
            stream = self._log_stream(job, index)
            if stream is None:
                return ""
            tail = dict(logGroupName=self._log_group, logStreamName=stream, limit=20)
            try:
                events = self._call(self.log_client.get_log_events, **tail).get("events")
            except AWSBatchError:
                return ""
            return stall_reason_in("\n".join(e.get("message", "") for e in events or [])) or ""
        return ""

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
        for role in roles_of(job):
            if role.name == role_name:
                if not 0 <= k < role.num_replicas:
                    raise InvalidArgumentError(
                        f"role {role_name!r} has replicas 0..{role.num_replicas - 1}, not {k}"
                    )
                return start + k
            start += role.num_replicas
        raise InvalidArgumentError(f"app has no role {role_name!r}")

    def _log_stream(self, job: Dict[str, Any], node_index: int) -> Optional[str]:
        main_node = int((job.get("nodeProperties") or {}).get("mainNode") or 0)
        candidates = self._describe_jobs([f"{job['jobId']}#{node_index}"])
        if not candidates and node_index == main_node:
            candidates = [job]  # without node jobs, the job's own stream is the main node's
        streams = [_container(node).get("logStreamName") for node in candidates]
        return next((str(stream) for stream in streams if stream), None)

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
            kwargs["startTime"] = to_millis_since_epoch(since)
        if until is not None:
            kwargs["endTime"] = to_millis_since_epoch(until)
        stream: Optional[str] = None
        ended = False
        while True:
            if stream is None:
                stream = self._log_stream(job, node_index)
            if stream is not None:
                while True:  # drain what is there now
                    resp = self._call(
                        self.log_client.get_log_events, logStreamName=stream, **kwargs
                    )
                    for event in resp.get("events") or []:
                        message = str(event.get("message", ""))
                        yield message if message.endswith("\n") else message + "\n"
                    token = resp.get("nextForwardToken")
                    # AWS hands back the same token at the end
                    if token in (None, kwargs.get("nextToken")):
                        break
                    kwargs["nextToken"] = token
            if not should_tail or ended:
                return
            job = self._get_job(app_id) or job
            if is_terminal(self._state(job)):
                ended = True  # read once more: lines written just before the end
                continue
            time.sleep(TAIL_POLL_SECONDS)


def create_scheduler(
    session_name: str,
    client: Optional[Any] = None,
    log_client: Optional[Any] = None,
    docker_client: Optional[DockerClient] = None,
    **kwargs: Any,
) -> AWSBatchScheduler:
    return AWSBatchScheduler(
        session_name,
        client=client,
        log_client=log_client,
        log_group=kwargs.get("log_group", DEFAULT_LOG_GROUP),
        docker_client=docker_client,
    )
