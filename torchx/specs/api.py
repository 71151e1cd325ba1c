"""The job data model: what an app is (AppDef, Role, Resource), how it is doing
(AppState, AppStatus) and how schedulers are configured (runopts); pure, and upstream's
names, fields and behaviour.
"""

from __future__ import annotations

import copy
import os.path
import re
import string
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Callable, Generic, Mapping, NamedTuple, Optional, TypeVar, Union

# specs.api is where upstream's code imports these from
from torchx.specs.errors import (  # noqa: F401
    AppStatusError,
    InvalidArgumentError,
    InvalidRunConfigException,
    MalformedAppHandleException,
    TorchXError,
    UnknownAppException,
    UnknownSchedulerException,
)
from torchx.specs.run_options import CfgVal, get_type_name, runopt, runopts  # noqa: F401
from torchx.specs.states import (  # noqa: F401
    _TERMINAL_STATES,
    ALL,
    MISSING,
    NONE,
    AppState,
    ReplicaState,
    is_started,
    is_terminal,
)
from torchx.util.types import to_dict  # noqa: F401


@dataclass
class Resource:
    """What one replica needs: cpus, gpus, memory (MB), plus scheduler-specific capabilities."""

    cpu: int
    gpu: int
    memMB: int
    capabilities: dict[str, Any] = field(default_factory=dict)
    devices: dict[str, int] = field(default_factory=dict)
    tags: dict[str, object] = field(default_factory=dict)

    @staticmethod
    def copy(original: Resource, **capabilities: Any) -> Resource:
        """A copy of ``original`` with ``capabilities`` merged in (tags dropped, as upstream)."""
        return Resource(
            cpu=original.cpu,
            gpu=original.gpu,
            memMB=original.memMB,
            capabilities={**original.capabilities, **capabilities},
            devices=dict(original.devices),
        )


NULL_RESOURCE: Resource = Resource(cpu=-1, gpu=-1, memMB=-1)


DEFAULT_RDZV_PORT = 29500  # torchrun's


class macros:
    """Placeholders in ``Role.args``/``env``/``metadata`` that schedulers fill in at submit time."""

    img_root = "${img_root}"
    base_img_root = "${base_img_root}"
    app_id = "${app_id}"
    replica_id = "${replica_id}"
    rank0_env = "${rank0_env}"
    # the port of a role's rendezvous on its rank-0 host (``dist.ddp`` without ``--rdzv_port``):
    # schedulers whose replicas share one host (local_cwd, local_docker) fill in a free port per
    # role, the others torchrun's usual one
    rdzv_port = "${rdzv_port}"

    @dataclass
    class Values:
        img_root: str
        app_id: str
        replica_id: str
        rank0_env: str
        base_img_root: str = "DEPRECATED"
        rdzv_port: str = str(DEFAULT_RDZV_PORT)

        def apply(self, role: Role) -> Role:
            """A deep copy of ``role`` with macros substituted in args, env values and metadata;
            each copy (one per replica) gets its own ``overrides``, the caller's role keeps its."""
            for name, value in list(role.overrides.items()):
                if hasattr(value, "__await__"):  # awaitable only once: resolve on the caller's
                    getattr(role, name)
            overrides = role.overrides
            role.overrides = {}
            try:
                copied = copy.deepcopy(role)
            finally:  # the caller's role keeps its (maybe un-copyable) overrides
                role.overrides = overrides
            copied.overrides = dict(overrides)
            copied.args = [self.substitute(a) for a in copied.args]
            copied.env = {k: self.substitute(v) for k, v in copied.env.items()}
            copied.metadata = self._apply_nested(copied.metadata)
            return copied

        def _apply_nested(self, value: Any) -> Any:
            """``value`` with its strings substituted, in lists and dicts at any depth."""
            if isinstance(value, str):
                return self.substitute(value)
            if isinstance(value, list):
                return [self._apply_nested(x) for x in value]
            if isinstance(value, dict):
                return {k: self._apply_nested(v) for k, v in value.items()}
            return value

        def substitute(self, arg: str) -> str:
            """Replace ``${name}`` macros in ``arg``; ``$$`` is a literal ``$``."""
            return string.Template(arg).safe_substitute(**asdict(self))


class RetryPolicy(str, Enum):
    """What a scheduler restarts when a replica fails (``max_retries`` times)."""

    REPLICA = "REPLICA"
    APPLICATION = "APPLICATION"
    ROLE = "ROLE"
    HOT_SPARE = "HOT_SPARE"  # upstream 0.7.0's name; schedulers that do not support it say so


class MountType(str, Enum):
    BIND = "bind"
    VOLUME = "volume"
    DEVICE = "device"


@dataclass
class BindMount:
    """A host path mounted into the replica."""

    src_path: str
    dst_path: str
    read_only: bool = False


@dataclass
class VolumeMount:
    """A named (persistent) volume mounted into the replica."""

    src: str
    dst_path: str
    read_only: bool = False


@dataclass
class DeviceMount:
    """A host device exposed to the replica."""

    src_path: str
    dst_path: str
    permissions: str = "rwm"


@dataclass
class Role:
    """A set of identical replicas running one entrypoint (e.g. ``trainer`` x 4)."""

    name: str
    image: str
    min_replicas: Optional[int] = None
    base_image: Optional[str] = None
    entrypoint: str = MISSING
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    num_replicas: int = 1
    max_retries: int = 0
    retry_policy: RetryPolicy = RetryPolicy.APPLICATION
    resource: Resource = field(default_factory=lambda: NULL_RESOURCE)
    port_map: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    mounts: list[Union[BindMount, VolumeMount, DeviceMount]] = field(default_factory=list)
    overrides: dict[str, Any] = field(default_factory=dict)

    def __getattribute__(self, attrname: str) -> Any:
        if attrname == "overrides" or attrname.startswith("__"):
            return super().__getattribute__(attrname)
        try:
            overrides = super().__getattribute__("overrides")
        except AttributeError:
            return super().__getattribute__(attrname)
        if attrname in overrides:
            value = overrides[attrname]
            if hasattr(value, "__await__"):
                value = _run_awaitable(value)
            elif callable(value):
                value = value()
            setattr(self, attrname, value)
            del overrides[attrname]
            return value
        return super().__getattribute__(attrname)

    def pre_proc(self, scheduler: str, dryrun_info: AppDryRunInfo[Any]) -> AppDryRunInfo[Any]:
        """Hook to adjust the scheduler request for this role; identity by default."""
        return dryrun_info


@dataclass
class AppDef:
    """A job: a name, its roles, and free-form metadata."""

    name: str
    roles: list[Role] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class ReplicaStatus:
    id: int
    state: AppState
    role: str
    hostname: str
    structured_error_msg: str = NONE


@dataclass
class RoleStatus:
    role: str
    replicas: list[ReplicaStatus]

    def to_json(self) -> dict[str, Any]:
        replicas = [{**asdict(r), "state": str(r.state)} for r in self.replicas]
        return {"role": self.role, "replicas": replicas}


@dataclass
class AppStatus:
    """A snapshot of an app: state, restarts, messages and per-replica statuses."""

    state: AppState
    num_restarts: int = 0
    msg: str = ""
    structured_error_msg: str = NONE
    ui_url: Optional[str] = None
    roles: list[RoleStatus] = field(default_factory=list)

    def is_terminal(self) -> bool:
        return is_terminal(self.state)

    def raise_for_status(self) -> None:
        """Raise :class:`AppStatusError` unless the app SUCCEEDED (like ``requests``)."""
        if self.state != AppState.SUCCEEDED:
            raise AppStatusError(self, f"job did not succeed: {self.error_summary()}")

    def error_summary(self) -> str:
        """One line: the state plus the most useful error (the worker's exception if known)."""
        from torchx.specs.status_format import error_summary

        return error_summary(self)

    def to_json(self, filter_roles: Optional[list[str]] = None) -> dict[str, Any]:
        roles = [r for r in self.roles if not filter_roles or r.role in filter_roles]
        return {
            "state": str(self.state),
            "num_restarts": self.num_restarts,
            "roles": [r.to_json() for r in roles],
            "msg": self.msg,
            "structured_error_msg": self.structured_error_msg,
            "url": self.ui_url,
        }

    def _format_error_message(self, msg: str, header: str, width: int = 80) -> str:
        """``msg`` (an RPC error cut to its message) broken at the first space after
        ``width`` characters, under ``header`` (upstream's helper; its tests call it)."""
        from torchx.specs.status_format import wrap_error_message

        return wrap_error_message(msg, header, width)

    def format(self, filter_roles: Optional[list[str]] = None) -> str:
        """Human-readable multi-line status, as ``torchx status`` prints it (upstream's layout)."""
        from torchx.specs.status_format import format_status

        return format_status(self, filter_roles)

    def __repr__(self) -> str:
        from torchx.specs.status_format import status_yaml

        return status_yaml(self)


T = TypeVar("T")


class AppDryRunInfo(Generic[T]):
    """What a scheduler would submit (``request``), printable via ``fmt``."""

    def __init__(self, request: T, fmt: Callable[[T], str]) -> None:
        self.request = request
        self._fmt = fmt
        self._app: Optional[AppDef] = None
        self._cfg: Mapping[str, CfgVal] = {}
        self._scheduler: Optional[str] = None
        self._workspace: Optional[Any] = None  # what a workspace build did (for --dryrun)
        self._run_request: Optional[Any] = None  # the caller's words for its tracker run

    def __repr__(self) -> str:
        return self._fmt(self.request)

    # read-only names for torchx's own readers (upstream's private fields stay the store)
    @property
    def app(self) -> Optional[AppDef]:
        return self._app

    @property
    def cfg(self) -> Mapping[str, CfgVal]:
        return self._cfg

    @property
    def workspace(self) -> Optional[Any]:
        return self._workspace

    def keeping_context(self, new: AppDryRunInfo[Any]) -> AppDryRunInfo[Any]:
        """``new`` (this request made again) with this one's workspace build and run request."""
        new._workspace, new._run_request = self._workspace, self._run_request
        return new


AppHandle = str


class ParsedAppHandle(NamedTuple):
    scheduler_backend: str
    session_name: str
    app_id: str


_HANDLE_RE = re.compile(r"^(?P<scheduler_backend>[^:/]+)://(?P<session_name>.*)/(?P<app_id>[^/]+)$")


def parse_app_handle(app_handle: AppHandle) -> ParsedAppHandle:
    """Split ``scheduler://session/app_id`` (session may be empty)."""
    m = _HANDLE_RE.match(app_handle or "")
    if not m:
        raise MalformedAppHandleException(app_handle)
    return ParsedAppHandle(**m.groupdict())


def make_app_handle(scheduler_backend: str, session_name: str, app_id: str) -> AppHandle:
    return f"{scheduler_backend}://{session_name}/{app_id}"


_MOUNT_KEY_ALIASES = dict(source="src", destination="dst", target="dst", read_only="readonly")
# the options each mount type reads; any other is refused rather than silently dropped
_MOUNT_KEYS: dict[str, tuple[str, ...]] = {
    MountType.BIND.value: ("src", "dst", "readonly"),
    MountType.VOLUME.value: ("src", "dst", "readonly"),
    MountType.DEVICE.value: ("src", "dst", "perm"),
}
_YES = ("yes", "true", "1", "on")
_NO = ("no", "false", "0", "off")


def _mount_groups(opts: list[str]) -> list[dict[str, Optional[str]]]:
    """The ``key=value`` items of ``opts``, one dict per mount (each ``type=`` starts one);
    a key given without ``=`` (``readonly``) maps to None."""
    groups: list[dict[str, Optional[str]]] = []
    for opt in opts:
        for item in filter(None, (p.strip() for p in opt.split(","))):
            key, eq, value = item.partition("=")
            key = _MOUNT_KEY_ALIASES.get(key.strip(), key.strip())
            if key == "type":
                groups.append({"type": value.strip()})
                continue
            if not groups:
                raise InvalidArgumentError(
                    f"mount option {item!r} must follow a type=bind|volume|device item"
                )
            kind = groups[-1]["type"] or ""
            known = _MOUNT_KEYS.get(kind, ())
            if kind in _MOUNT_KEYS and key not in known:
                raise InvalidArgumentError(
                    f"unknown mount option {key!r} for type={kind}; use"
                    f" {', '.join(known)} (e.g. type={kind},src=...,dst=...)"
                )
            if key in groups[-1]:
                raise InvalidArgumentError(f"mount option {key} is given twice; give it once")
            groups[-1][key] = value.strip() if eq else None
    return groups


def _mount_value(group: dict[str, Optional[str]], key: str) -> str:
    value = group.get(key)
    if not value:
        given = ",".join(k if v is None else f"{k}={v}" for k, v in group.items())
        raise InvalidArgumentError(f"mount {given} is missing {key}=")
    return value


def _read_only(group: dict[str, Optional[str]]) -> bool:
    """``readonly`` alone or ``=yes|true|1|on`` is read-only, ``=no|false|0|off`` (or no
    ``readonly``) writable; any other value is refused, never taken as writable."""
    if "readonly" not in group:
        return False
    value = group["readonly"]
    if value is None or value.lower() in _YES:
        return True
    if value.lower() in _NO:
        return False
    raise InvalidArgumentError(
        f"mount option readonly={value!r} is not valid; use readonly=true for a read-only"
        " mount or readonly=false for a writable one"
    )


def parse_mounts(opts: list[str]) -> list[Union[BindMount, VolumeMount, DeviceMount]]:
    """Parse docker-style mount options, e.g. ``["type=bind,src=/a,dst=/b,readonly"]``.

    An option the mount's type does not read, or a ``readonly`` that is not a clear yes or
    no, is an error: a mount must never end up writable because a word was misread."""
    mounts: list[Union[BindMount, VolumeMount, DeviceMount]] = []
    for g in _mount_groups(opts):
        kind = g["type"] or ""
        if kind == MountType.BIND:
            src = os.path.expanduser(_mount_value(g, "src"))
            mounts.append(BindMount(src, _mount_value(g, "dst"), _read_only(g)))
        elif kind == MountType.VOLUME:
            src = _mount_value(g, "src")
            mounts.append(VolumeMount(src, _mount_value(g, "dst"), _read_only(g)))
        elif kind == MountType.DEVICE:
            src = _mount_value(g, "src")
            perm = g.get("perm", "rwm")
            if not perm or set(perm) - set("rwm"):
                raise InvalidArgumentError(
                    f"mount perm={perm!r} is not valid; use a combination of r, w and m"
                )
            mounts.append(DeviceMount(src, g.get("dst") or src, perm))
        else:
            raise InvalidArgumentError(
                f"unknown mount type {kind!r}; use type=bind, type=volume or type=device"
            )
    return mounts


def _run_awaitable(awaitable: Any) -> Any:
    """Resolve an awaitable override synchronously, in a loop of its own when this thread has
    none (``asyncio.get_event_loop()`` raises once another test or library closed it)."""
    import asyncio

    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    raise RuntimeError("an awaitable role override cannot be resolved inside a running loop")
