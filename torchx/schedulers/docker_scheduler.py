"""``local_docker``: each replica of an app is a container of the local Docker engine.

Containers run on the host network (``TORCHX_RANK0_HOST=localhost``), so a ``dist.ddp``
rendezvous works as across ``local_cwd`` processes. What any process needs to find and read
an app lives in the containers' labels (app id, role, replica, the AppDef, the token and
owner). Containers are never removed by torchx, so an ended app's logs stay readable. A
keyed submission's container names derive from its token (``keyed_app_id``): the engine
refuses a racing second submitter's first container, and it re-attaches.

Each app has a state directory on the engine's host (``$TORCHX_HOME/docker/<app id>``),
bind-mounted into every replica at ``/var/run/torchx``: progress reports, torchelastic
error files (a stall's reason among them), and the record of a cancel, so ``describe`` from
any process tells CANCELLED from a failure.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, TypedDict, cast

import torchx
from torchx.runtime.watchdog import wrap
from torchx.schedulers.api import (
    IDEMPOTENCY_TOKEN,
    OWNER,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    app_stall_timeout,
    filter_regex,
    keyed_app_id,
    split_lines_iterator,
    stored_app,
)
from torchx.schedulers.devices import get_device_mounts
from torchx.schedulers.ids import make_unique
from torchx.schedulers.ports import rdzv_port_for
from torchx.specs.api import (
    NONE,
    AppDef,
    AppDryRunInfo,
    AppState,
    BindMount,
    CfgVal,
    DeviceMount,
    ReplicaStatus,
    RoleStatus,
    TorchXError,
    VolumeMount,
    is_terminal,
    macros,
    runopts,
)
from torchx.specs.serialize import appdef_from_dict, appdef_to_dict
from torchx.util.paths import torchx_home
from torchx.workspace.docker_workspace import (
    DockerUnavailableError,
    DockerWorkspaceMixin,
    connect_docker,
    ensure_image,
)

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container

log: logging.Logger = logging.getLogger(__name__)

LABEL_VERSION: str = DockerWorkspaceMixin.LABEL_VERSION
LABEL_APP_ID = "torchx.pytorch.org/app-id"
LABEL_ROLE_NAME = "torchx.pytorch.org/role-name"
LABEL_REPLICA_ID = "torchx.pytorch.org/replica-id"
LABEL_IDEMPOTENCY_TOKEN = "torchx.pytorch.org/idempotency-token"
LABEL_OWNER = "torchx.pytorch.org/owner"
LABEL_APP = "torchx.pytorch.org/app"  # the submitted AppDef, JSON
LABEL_STATE_DIR = "torchx.pytorch.org/state-dir"

NETWORK = "host"
RANK0_ENV = "TORCHX_RANK0_HOST"
STATE_MOUNT = "/var/run/torchx"  # the app's state directory inside each container
PROGRESS_FILE = "progress.json"
CANCELLED_FILE = "cancelled"
STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL on cancel, as `docker stop`

CONTAINER_STATE: Dict[str, AppState] = {
    "created": AppState.SUBMITTED,
    "restarting": AppState.PENDING,
    "running": AppState.RUNNING,
    "paused": AppState.PENDING,
    "removing": AppState.PENDING,
    "dead": AppState.FAILED,
}


class DockerOpts(TypedDict, total=False):
    """``local_docker``'s run options (upstream's name)."""

    copy_env: Optional[List[str]]
    env: Optional[Dict[str, str]]
    privileged: bool


@dataclass
class DockerContainer:
    """One replica: ``docker run IMAGE COMMAND`` with ``kwargs`` (the SDK's ``containers.run``)."""

    image: str
    command: List[str]
    kwargs: Dict[str, Any]


@dataclass
class DockerJob:
    app_id: str
    containers: List[DockerContainer]
    state_dir: str = ""

    def __str__(self) -> str:
        import yaml

        shown = [
            json.loads(json.dumps({"image": c.image, "command": c.command, **c.kwargs}))
            for c in self.containers
        ]  # the SDK's Mount and DeviceRequest are dicts: plain ones for YAML
        for c in shown:  # the AppDef label repeats the request: shown once, in the request
            c["labels"] = {k: v for k, v in c["labels"].items() if k != LABEL_APP}
        return yaml.safe_dump(shown, sort_keys=False, default_flow_style=False)

    __repr__ = __str__


def has_docker() -> bool:
    """Whether the Docker SDK is installed and an engine answers."""
    try:
        connect_docker()
        return True
    except TorchXError:
        return False


class DockerScheduler(DockerWorkspaceMixin, Scheduler[DockerJob]):
    """``local_docker``. No gang scheduling: a failed replica restarts alone (``max_retries``)."""

    names_keyed_apps = True  # the engine refuses a taken container name: the claim

    def __init__(self, session_name: str, docker_client: Optional[DockerClient] = None) -> None:
        super().__init__("local_docker", session_name, docker_client=docker_client)

    def _run_opts(self) -> runopts:
        opts = runopts()
        opts.add(
            "copy_env",
            type_=List[str],
            help="glob patterns of environment variables to copy into the containers if the"
            " AppDef does not set them. Ex: FOO_*",
        )
        opts.add(
            "env",
            type_=Dict[str, str],
            help="environment variables for the containers, K1:v1,K2:v2 (or ; separated);"
            " applied over copy_env",
        )
        opts.add(
            "privileged",
            type_=bool,
            default=False,
            help="run the containers with elevated permissions (docker run --privileged)",
        )
        return opts

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[DockerJob]:
        try:
            from docker.types import DeviceRequest, Mount
        except ImportError:
            raise DockerUnavailableError(
                "local_docker needs the Docker SDK: pip install 'torchx[docker]'"
            ) from None

        # cfg is resolved: its values have their run options' types
        patterns = cast(List[str], cfg.get("copy_env") or [])
        default_env = {k: os.environ[k] for p in patterns for k in fnmatch.filter(os.environ, p)}
        default_env.update(cast(Dict[str, str], cfg.get("env") or {}))

        app_id = keyed_app_id(app) or make_unique(app.name)
        state_dir = str(torchx_home() / "docker" / app_id)
        app_json = json.dumps(appdef_to_dict(stored_app(app)), separators=(",", ":"))
        req = DockerJob(app_id=app_id, containers=[], state_dir=state_dir)
        # Every replica's host name resolves to a loopback address of its own (all share the
        # host's network): torchrun tells nodes apart by fully qualified host name and pid, and
        # names that all resolved to 127.0.0.1 would all read back as "localhost".
        names = [
            _container_name(app_id, role.name, i)
            for role in app.roles
            for i in range(role.num_replicas)
        ]
        hosts = {name: f"127.0.{2 + n // 250}.{2 + n % 250}" for n, name in enumerate(names)}
        for role in app.roles:
            mounts = [Mount(target=STATE_MOUNT, source=state_dir, type="bind")]
            for path in _host_stores(role.env):
                mounts.append(Mount(target=path, source=path, type="bind"))
            devices: List[str] = []
            for mount in list(role.mounts) + get_device_mounts(role.resource.devices):
                if isinstance(mount, BindMount):
                    mounts.append(Mount(mount.dst_path, mount.src_path, "bind", mount.read_only))
                elif isinstance(mount, VolumeMount):
                    mounts.append(Mount(mount.dst_path, mount.src, "volume", mount.read_only))
                elif isinstance(mount, DeviceMount):
                    devices.append(f"{mount.src_path}:{mount.dst_path}:{mount.permissions}")
                else:
                    raise TypeError(f"unknown mount type {mount}")
            rdzv_port = rdzv_port_for(role)  # one free port per role, shared by its replicas
            for replica_id in range(role.num_replicas):
                values = macros.Values(
                    img_root="",
                    app_id=app_id,
                    replica_id=str(replica_id),
                    rank0_env=RANK0_ENV,
                    rdzv_port=rdzv_port,
                )
                replica = values.apply(role)
                error_file = f"{STATE_MOUNT}/{role.name}-{replica_id}-error.json"
                env = {**default_env, **replica.env, RANK0_ENV: "localhost"}
                env["TORCHX_IMAGE"] = role.image
                env.setdefault("PYTHONUNBUFFERED", "1")
                env["TORCHX_PROGRESS_FILE"] = f"{STATE_MOUNT}/{PROGRESS_FILE}"
                env["TORCHELASTIC_ERROR_FILE"] = error_file
                labels = {
                    LABEL_VERSION: torchx.__version__,
                    LABEL_APP_ID: app_id,
                    LABEL_ROLE_NAME: role.name,
                    LABEL_REPLICA_ID: str(replica_id),
                    LABEL_STATE_DIR: state_dir,
                    LABEL_APP: app_json,
                }
                if app.metadata.get(IDEMPOTENCY_TOKEN):
                    labels[LABEL_IDEMPOTENCY_TOKEN] = app.metadata[IDEMPOTENCY_TOKEN]
                if app.metadata.get(OWNER):
                    labels[LABEL_OWNER] = app.metadata[OWNER]
                name = _container_name(app_id, role.name, replica_id)
                kwargs: Dict[str, Any] = {
                    "name": name,
                    "hostname": name,
                    "extra_hosts": hosts,
                    "environment": env,
                    "labels": labels,
                    "network_mode": NETWORK,
                    "privileged": bool(cfg.get("privileged")),
                    "mounts": mounts,
                    "devices": devices,
                    "init": True,  # PID 1 forwards signals: a cancel's SIGTERM reaches the job
                }
                if replica.max_retries > 0:
                    kwargs["restart_policy"] = {
                        "Name": "on-failure",
                        "MaximumRetryCount": replica.max_retries,
                    }
                resource = replica.resource
                if resource.memMB > 0:
                    # PyTorch's data loaders need a /dev/shm larger than Docker's 64 MB
                    kwargs["mem_limit"] = kwargs["shm_size"] = f"{int(resource.memMB)}m"
                if resource.cpu > 0:
                    kwargs["nano_cpus"] = int(resource.cpu * 1e9)
                if resource.gpu > 0:
                    kwargs["device_requests"] = [
                        DeviceRequest(count=resource.gpu, capabilities=[["compute", "utility"]])
                    ]
                # the replicas share the state dir: each watchdog judges the whole gang
                beacon = ["--beacon", f"{STATE_MOUNT}/{role.name}-{replica_id}.active"]
                peers = ["--peers", f"{STATE_MOUNT}/*.active"]
                command = wrap(
                    [replica.entrypoint, *replica.args], app_stall_timeout(app), *beacon, *peers
                )
                req.containers.append(DockerContainer(replica.image, command, kwargs))
        return AppDryRunInfo(req, repr)

    def _validate(
        self, app: AppDef, scheduler: str, cfg: Optional[Mapping[str, CfgVal]] = None
    ) -> None:
        """Any resource runs on Docker (none means no limit), as upstream."""

    def schedule(self, dryrun_info: AppDryRunInfo[DockerJob]) -> str:
        req = dryrun_info.request
        client = self._docker_client
        # a planned workspace image (sha256:...) is built first; _build passes the others on
        images = {
            image: self._build(client, image)
            for image in sorted({c.image for c in req.containers})  # the same order each run
        }
        cpus = _engine_cpus(client)
        Path(req.state_dir).mkdir(parents=True, exist_ok=True)
        for image in set(images.values()):
            ensure_image(client, image)
        started: List[Container] = []
        for c in req.containers:
            kwargs = dict(c.kwargs)
            if cpus and kwargs.get("nano_cpus", 0) > cpus * 1e9:
                log.warning(
                    "%s asks for %g CPUs; the engine has %d: limiting it to %d",
                    kwargs["name"],
                    kwargs["nano_cpus"] / 1e9,
                    cpus,
                    cpus,
                )
                kwargs["nano_cpus"] = int(cpus * 1e9)
            image = images[c.image]
            try:
                started.append(client.containers.run(image, c.command, detach=True, **kwargs))
            except Exception:  # a half-started app must not run on: stop what started
                for container in started:
                    container.kill()
                raise
        return req.app_id

    def _containers(self, app_id: Optional[str] = None, **labels: str) -> List[Container]:
        selectors = [f"{LABEL_APP_ID}={app_id}" if app_id else LABEL_APP_ID]
        selectors += [f"{k}={v}" for k, v in labels.items()]
        # ignore_removed: one removed meanwhile (docker rm) is not listed, not a 404
        return self._docker_client.containers.list(
            all=True, filters={"label": selectors}, ignore_removed=True
        )

    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        containers = self._containers(app_id)
        if not containers:
            return None
        app = _stored_app(containers)
        state_dir = _state_dir(containers)
        roles_statuses: Dict[str, RoleStatus] = {}
        replica_states: List[AppState] = []
        for c in sorted(containers, key=_replica_key):
            role = c.labels[LABEL_ROLE_NAME]
            state = _container_state(c)
            replica_states.append(state)
            roles_statuses.setdefault(role, RoleStatus(role, [])).replicas.append(
                ReplicaStatus(
                    id=int(c.labels[LABEL_REPLICA_ID]), role=role, state=state, hostname=c.name
                )
            )
        state, msg = _app_state(replica_states, state_dir)
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            msg=msg,
            structured_error_msg=_first_error(state_dir) if state == AppState.FAILED else NONE,
            roles=app.roles if app else [],
            roles_statuses=list(roles_statuses.values()),
            metadata=dict(app.metadata) if app else {},
            num_restarts=max((c.attrs.get("RestartCount", 0) for c in containers), default=0),
        )

    def list(self) -> List[ListAppResponse]:
        return self._listing(self._containers())

    def find_by_idempotency_token(
        self, token: str, cfg: Optional[Mapping[str, CfgVal]] = None
    ) -> List[ListAppResponse]:
        return self._listing(self._containers(**{LABEL_IDEMPOTENCY_TOKEN: token}))

    def _listing(self, containers: List[Container]) -> List[ListAppResponse]:
        """One entry per app, oldest first (the engine's creation time, then the app id)."""
        apps: Dict[str, List[Container]] = {}
        for c in containers:
            apps.setdefault(c.labels[LABEL_APP_ID], []).append(c)
        listed: List[tuple[str, str, ListAppResponse]] = []
        for app_id, members in apps.items():
            state_dir = _state_dir(members)
            state, _ = _app_state([_container_state(c) for c in members], state_dir)
            app = _stored_app(members)
            created = min(str(c.attrs.get("Created", "")) for c in members)
            name = app.name if app else app_id
            listed.append((created, app_id, ListAppResponse(app_id, state, name=name)))
        return [entry for _, _, entry in sorted(listed, key=lambda e: (e[0], e[1]))]

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
        found = self._containers(app_id, **{LABEL_ROLE_NAME: role_name, LABEL_REPLICA_ID: str(k)})
        if not found:
            raise ValueError(f"no container for {app_id}/{role_name}/{k}")
        chunks = found[0].logs(
            stdout=streams != Stream.STDERR,
            stderr=streams != Stream.STDOUT,
            stream=True,
            follow=should_tail,
            since=since,
            until=until,
        )
        lines = split_lines_iterator(chunk.decode("utf-8", "replace") for chunk in chunks)
        return filter_regex(regex, lines)

    def _name_taken(self, e: Exception) -> bool:
        """The engine refuses a second container under a name (409), stopped or not;
        containers are created in one order, so a racing loser's first one fails."""
        from docker.errors import APIError

        return isinstance(e, APIError) and e.status_code == 409

    def wait_for_change(self, app_id: str, timeout: float) -> None:
        """Returns when a running replica exits (or after ``timeout``)."""
        running = [c for c in self._containers(app_id) if c.status == "running"]
        if not running:
            time.sleep(timeout)
            return
        from urllib3.exceptions import HTTPError

        try:
            running[0].wait(timeout=max(timeout, 0.1))
        except (OSError, HTTPError):  # the SDK's read timeout (requests' or urllib3's): no change
            return

    def progress_path(self, app_id: str) -> Optional[str]:
        containers = self._containers(app_id)
        if not containers:
            return None
        return str(_state_dir(containers) / PROGRESS_FILE)

    def _cancel_existing(self, app_id: str) -> None:
        """Record the cancel (unless the app already ended), then stop every replica: SIGTERM,
        SIGKILL after ``STOP_GRACE`` s. A restart policy does not restart a stopped container."""
        containers = self._containers(app_id)
        if all(is_terminal(_container_state(c)) for c in containers):  # none, or all ended
            return
        state_dir = _state_dir(containers)
        if not (state_dir / CANCELLED_FILE).exists():
            state_dir.mkdir(parents=True, exist_ok=True)
            (state_dir / CANCELLED_FILE).write_text("cancelled")
        from docker.errors import APIError

        client = self._docker_client
        live = [c for c in containers if c.status in ("running", "restarting", "paused")]
        for c in live:  # all at once, so the replicas stop together
            try:
                client.api.kill(c.id, signal="SIGTERM")
            except APIError as e:  # it exited meanwhile: nothing to stop
                log.debug("%s: %s", c.name, e)
        for c in live:  # `docker stop`: waits up to STOP_GRACE s, then SIGKILLs
            client.api.stop(c.id, timeout=int(STOP_GRACE))


def _host_stores(env: Mapping[str, str]) -> List[str]:
    """The host directory of a tracking store the job's env names by file (MLflow's sqlite
    store, ``sqlite:////abs/path.db``), mounted at its own path so a rank's tracker calls
    reach the job's run as on ``local_cwd``; its artifacts sit beside it by default."""
    uri = env.get("MLFLOW_TRACKING_URI", "")
    if uri.startswith("sqlite:////"):
        return [os.path.dirname(uri[len("sqlite:///") :])]
    return []


def _container_name(app_id: str, role: str, replica_id: int) -> str:
    """Unique per engine; app id and role trimmed as upstream (a host name is <= 64 chars),
    never starting with a character Docker refuses there (``-``, ``_``, ``.``)."""
    return f"{app_id[-30:].lstrip('-_.')}-{role[:30]}-{replica_id}"


def _replica_key(c: Container) -> tuple[str, int]:
    return c.labels.get(LABEL_ROLE_NAME, ""), int(c.labels.get(LABEL_REPLICA_ID, "0"))


def _state_dir(containers: List[Container]) -> Path:
    """The app's state directory on the engine's host (every replica's label names it)."""
    return Path(containers[0].labels[LABEL_STATE_DIR])


def _stored_app(containers: List[Container]) -> Optional[AppDef]:
    for c in containers:
        raw = c.labels.get(LABEL_APP)
        if raw:
            return appdef_from_dict(json.loads(raw))
    return None


def _container_state(c: Container) -> AppState:
    if c.status == "exited":
        code = c.attrs.get("State", {}).get("ExitCode", 1)
        return AppState.SUCCEEDED if code == 0 else AppState.FAILED
    return CONTAINER_STATE.get(c.status, AppState.UNKNOWN)


def _app_state(replicas: List[AppState], state_dir: Path) -> tuple[AppState, str]:
    """The app's state from its replicas' and the reason recorded when it was stopped (a
    replica created but never started does not keep a stopped app alive)."""
    cancelled = (state_dir / CANCELLED_FILE).exists()
    live = [
        s for s in replicas if not is_terminal(s) and not (cancelled and s == AppState.SUBMITTED)
    ]
    if live:
        return live[0], NONE
    if cancelled:
        return AppState.CANCELLED, NONE
    if all(s == AppState.SUCCEEDED for s in replicas):
        return AppState.SUCCEEDED, NONE
    return AppState.FAILED, _stall_reason(state_dir) or NONE


def _stall_reason(state_dir: Path) -> Optional[str]:
    """A watchdog's stall reason in a replica's error file (``torchx.runtime.watchdog``)."""
    for path in state_dir.glob("*-error.json"):
        try:
            message = json.loads(path.read_text())["message"]["message"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(message, str) and message.startswith("stalled: "):
            return message
    return None


def _first_error(state_dir: Path) -> str:
    """The earliest torchelastic error file of the app's replicas, as ``local_cwd`` reports."""
    files = sorted(state_dir.glob("*-error.json"), key=lambda p: p.stat().st_mtime)
    return files[0].read_text() if files else NONE


def _engine_cpus(client: DockerClient) -> int:
    from docker.errors import DockerException

    try:
        return int(client.info().get("NCPU", 0))
    except (DockerException, OSError, ValueError, TypeError):  # no answer: no limit adjusted
        return 0


def create_scheduler(
    session_name: str, docker_client: Optional[DockerClient] = None, **kwargs: Any
) -> DockerScheduler:
    return DockerScheduler(session_name=session_name, docker_client=docker_client)
