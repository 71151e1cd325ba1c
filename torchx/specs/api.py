"""The job data model: what an app is (AppDef, Role, Resource), how it is doing
(AppState, AppStatus) and how schedulers are configured (runopts).

Pure: no I/O, no subprocess, no optional dependency. Names, fields and
behaviour follow upstream TorchX so existing user code keeps working.
"""

from __future__ import annotations

import copy
import json
import os.path
import re
import string
import textwrap
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import Enum
from typing import (
    Any,
    Callable,
    Dict,
    Generic,
    Iterator,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Tuple,
    Type,
    TypeVar,
    Union,
)

ALL = "all"
MISSING = "<MISSING>"
NONE = "<NONE>"


# --------------------------------------------------------------------------- errors


class TorchXError(Exception):
    """Base of every error a user can cause; the CLI prints it as one line."""


class InvalidRunConfigException(TorchXError):
    """A scheduler run config (``-cfg``) is missing a required key or has a wrong type."""

    def __init__(self, invalid_reason: str, cfg_key: str, cfg: Any) -> None:
        super().__init__(f"{invalid_reason}. Given run configs: {cfg}")
        self.invalid_reason = invalid_reason
        self.cfg_key = cfg_key
        self.cfg = cfg


class MalformedAppHandleException(TorchXError):
    """An app handle that is not ``{scheduler}://{session}/{app_id}``."""

    def __init__(self, app_handle: str) -> None:
        super().__init__(
            f"{app_handle!r} is not a valid app handle;"
            " expected the form SCHEDULER://SESSION/APP_ID (e.g. local_cwd://torchx/echo-abc123)"
        )
        self.app_handle = app_handle


class UnknownSchedulerException(TorchXError):
    """The named scheduler backend is not registered."""

    def __init__(self, scheduler_backend: str, known: Optional[List[str]] = None) -> None:
        msg = f"unknown scheduler {scheduler_backend!r}"
        if known:
            msg += f"; available schedulers: {', '.join(known)}"
        super().__init__(msg)
        self.scheduler_backend = scheduler_backend


class UnknownAppException(TorchXError):
    """The app handle names an app the scheduler does not know (any more)."""

    def __init__(self, app_handle: str) -> None:
        super().__init__(
            f"app {app_handle} does not exist or has been removed from its scheduler;"
            " check the handle with `torchx list -s SCHEDULER`"
        )
        self.app_handle = app_handle


class InvalidArgumentError(TorchXError, ValueError):
    """A component or API argument with a bad value (e.g. ``-j 0x2``)."""


# --------------------------------------------------------------------------- resources


@dataclass
class Resource:
    """What one replica needs: cpus, gpus, memory (MB), plus scheduler-specific capabilities."""

    cpu: int
    gpu: int
    memMB: int
    capabilities: Dict[str, Any] = field(default_factory=dict)
    devices: Dict[str, int] = field(default_factory=dict)
    tags: Dict[str, object] = field(default_factory=dict)

    @staticmethod
    def copy(original: Resource, **capabilities: Any) -> Resource:
        """A copy of ``original`` with ``capabilities`` merged in.

        Tags are dropped, as upstream.
        """
        res_capabilities = dict(original.capabilities)
        res_capabilities.update(capabilities)
        return Resource(
            cpu=original.cpu,
            gpu=original.gpu,
            memMB=original.memMB,
            capabilities=res_capabilities,
            devices=dict(original.devices),
        )


NULL_RESOURCE: Resource = Resource(cpu=-1, gpu=-1, memMB=-1)


# --------------------------------------------------------------------------- macros


class macros:
    """Placeholders in ``Role.args``/``env``/``metadata`` that schedulers fill in at submit time."""

    img_root = "${img_root}"
    base_img_root = "${base_img_root}"
    app_id = "${app_id}"
    replica_id = "${replica_id}"
    rank0_env = "${rank0_env}"

    @dataclass
    class Values:
        img_root: str
        app_id: str
        replica_id: str
        rank0_env: str
        base_img_root: str = "DEPRECATED"

        def apply(self, role: Role) -> Role:
            """A deep copy of ``role`` with macros substituted in args, env values and metadata."""
            overrides = role.overrides
            role.overrides = {}
            try:
                copied = copy.deepcopy(role)
            finally:
                role.overrides = (
                    overrides  # the caller's role keeps its (maybe un-copyable) overrides
                )
            copied.overrides = overrides
            role = copied
            role.args = [self.substitute(a) for a in role.args]
            role.env = {k: self.substitute(v) for k, v in role.env.items()}
            role.metadata = self._apply_nested(role.metadata)
            return role

        def _apply_nested(self, d: Dict[str, Any]) -> Dict[str, Any]:
            out: Dict[str, Any] = {}
            for k, v in d.items():
                if isinstance(v, str):
                    out[k] = self.substitute(v)
                elif isinstance(v, list):
                    out[k] = [self.substitute(x) if isinstance(x, str) else x for x in v]
                elif isinstance(v, dict):
                    out[k] = self._apply_nested(v)
                else:
                    out[k] = v
            return out

        def substitute(self, arg: str) -> str:
            """Replace ``${name}`` macros in ``arg``; ``$$`` is a literal ``$``."""
            return string.Template(arg).safe_substitute(**asdict(self))


# --------------------------------------------------------------------------- roles and apps


class RetryPolicy(str, Enum):
    """What a scheduler restarts when a replica fails (``max_retries`` times)."""

    REPLICA = "REPLICA"
    APPLICATION = "APPLICATION"
    ROLE = "ROLE"


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
    args: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    num_replicas: int = 1
    max_retries: int = 0
    retry_policy: RetryPolicy = RetryPolicy.APPLICATION
    resource: Resource = field(default_factory=lambda: NULL_RESOURCE)
    port_map: Dict[str, int] = field(default_factory=dict)
    metadata: Dict[str, Any] = field(default_factory=dict)
    mounts: List[Union[BindMount, VolumeMount, DeviceMount]] = field(default_factory=list)
    overrides: Dict[str, Any] = field(default_factory=dict)

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
                import asyncio

                value = asyncio.get_event_loop().run_until_complete(value)
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
    roles: List[Role] = field(default_factory=list)
    metadata: Dict[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------- states


class AppState(int, Enum):
    """Lifecycle of an app (and of each replica: ``ReplicaState``)."""

    UNSUBMITTED = 0
    SUBMITTED = 1
    PENDING = 2
    RUNNING = 3
    SUCCEEDED = 4
    FAILED = 5
    CANCELLED = 6
    UNKNOWN = 7

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{self.name} ({self.value})"


ReplicaState = AppState

_TERMINAL_STATES = (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED)


def is_terminal(state: AppState) -> bool:
    """True once the app can no longer change state."""
    return state in _TERMINAL_STATES


def is_started(state: AppState) -> bool:
    return is_terminal(state) or state == AppState.RUNNING


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
    replicas: List[ReplicaStatus]

    def to_json(self) -> Dict[str, Any]:
        return {
            "role": self.role,
            "replicas": [
                {
                    "id": r.id,
                    "state": str(r.state),
                    "role": r.role,
                    "hostname": r.hostname,
                    "structured_error_msg": r.structured_error_msg,
                }
                for r in self.replicas
            ],
        }


class AppStatusError(TorchXError):
    """Raised by ``AppStatus.raise_for_status`` when the app did not succeed."""

    def __init__(self, status: AppStatus, *args: Any) -> None:
        super().__init__(*args)
        self.status = status


@dataclass
class AppStatus:
    """A snapshot of an app: state, restarts, messages and per-replica statuses."""

    state: AppState
    num_restarts: int = 0
    msg: str = ""
    structured_error_msg: str = NONE
    ui_url: Optional[str] = None
    roles: List[RoleStatus] = field(default_factory=list)

    def is_terminal(self) -> bool:
        return is_terminal(self.state)

    def raise_for_status(self) -> None:
        """Raise :class:`AppStatusError` unless the app SUCCEEDED (like ``requests``)."""
        if self.state != AppState.SUCCEEDED:
            raise AppStatusError(self, f"job did not succeed: {self.error_summary()}")

    def error_summary(self) -> str:
        """One line: the state plus the most useful error (the worker's exception if known)."""
        detail = self.msg if self.msg and self.msg != NONE else ""
        err = _error_message(self.structured_error_msg)
        if not err:
            for role in self.roles:
                for r in role.replicas:
                    err = _error_message(r.structured_error_msg)
                    if err:
                        break
                if err:
                    break
        parts = [str(self.state)] + [p for p in (err, detail) if p]
        return ": ".join(parts[:2]) + (f" ({parts[2]})" if len(parts) > 2 else "")

    def to_json(self, filter_roles: Optional[List[str]] = None) -> Dict[str, Any]:
        roles = [r for r in self.roles if not filter_roles or r.role in filter_roles]
        return {
            "state": str(self.state),
            "num_restarts": self.num_restarts,
            "roles": [r.to_json() for r in roles],
            "msg": self.msg,
            "structured_error_msg": self.structured_error_msg,
            "url": self.ui_url,
        }

    def format(self, filter_roles: Optional[List[str]] = None) -> str:
        """Human-readable multi-line status, as ``torchx status`` prints it."""
        roles_lines = []
        for role in self.roles:
            if filter_roles and role.role not in filter_roles:
                continue
            for r in role.replicas:
                marker = "*" if r.id == 0 else " "
                line = f"{marker}{r.role}[{r.id}]:{r.state}"
                err = _format_error(r.structured_error_msg)
                if err:
                    line += "\n" + textwrap.indent(err, "      ")
                elif r.state in (AppState.FAILED, AppState.CANCELLED):
                    line += " (no reply file)"
                if r.hostname:
                    line += f" on {r.hostname}"
                roles_lines.append(line)
        roles_str = (
            ("\n" + textwrap.indent("\n".join(roles_lines), "      ")) if roles_lines else ""
        )
        err = _format_error(self.structured_error_msg)
        return (
            "AppStatus:\n"
            f"    State: {self.state}\n"
            f"    Num Restarts: {self.num_restarts}\n"
            f"    Roles: {roles_str}\n"
            f"    Msg: {self.msg}\n"
            f"    Structured Error Msg: {err or self.structured_error_msg}\n"
            f"    UI URL: {self.ui_url}\n"
        )

    def __repr__(self) -> str:
        d = asdict(self)
        d["state"] = repr(self.state)
        for role in d["roles"]:
            for r in role["replicas"]:
                r["state"] = repr(r["state"])
        import yaml

        return yaml.dump({"AppStatus": d}, sort_keys=False)


def _parse_error_json(structured: str) -> Optional[Dict[str, Any]]:
    if not structured or structured == NONE:
        return None
    try:
        data = json.loads(structured)
    except (TypeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _error_message(structured: str) -> str:
    """The last line of a torchelastic reply file's message (usually ``ExcType: text``)."""
    if not structured or structured == NONE:
        return ""
    data = _parse_error_json(structured)
    if data is None:
        return structured.strip().splitlines()[-1] if structured.strip() else ""
    message = data.get("message", "")
    if isinstance(message, dict):
        message = message.get("message", "")
    lines = [ln for ln in str(message).strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", ln.strip()):
            return ln.strip()
    return lines[-1].strip() if lines else ""


def _format_error(structured: str) -> str:
    data = _parse_error_json(structured)
    if data is None:
        return ""
    msg = data.get("message", {})
    extra = msg.get("extraInfo", {}) if isinstance(msg, dict) else {}
    text = msg.get("message", "") if isinstance(msg, dict) else str(msg)
    ts = extra.get("timestamp") if isinstance(extra, dict) else None
    when = ""
    if ts:
        try:
            when = datetime.fromtimestamp(int(ts)).isoformat()
        except (TypeError, ValueError):
            when = str(ts)
    header = f"error: {_error_message(structured)}"
    if when:
        header += f" (at {when})"
    return header + ("\n" + textwrap.indent(str(text).strip(), "  ") if text else "")


# --------------------------------------------------------------------------- run configs

CfgVal = Union[str, int, float, bool, List[str], Dict[str, str], None]

T = TypeVar("T")


def get_type_name(tp: Any) -> str:
    """``int`` -> ``"int"``; typing constructs print as written (``typing.List[str]``)."""
    if getattr(tp, "__module__", None) != "typing" and hasattr(tp, "__name__"):
        return tp.__name__
    return str(tp)


def _split_list(value: str) -> List[str]:
    return [v for v in re.split(r"[,;]", value) if v]


def _split_dict(value: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for pair in _split_list(value):
        if ":" not in pair:
            raise ValueError(f"expected key:value pairs, got {pair!r}")
        k, v = pair.split(":", 1)
        out[k.strip()] = v.strip()
    return out


@dataclass
class runopt:
    """One scheduler run option: default, type, required flag and help."""

    default: CfgVal
    opt_type: Type[CfgVal]
    is_required: bool
    help: str

    @property
    def is_type_list_of_str(self) -> bool:
        return self.opt_type in (List[str], list)

    @property
    def is_type_dict_of_str(self) -> bool:
        return self.opt_type in (Dict[str, str], dict)

    def cast_to_type(self, value: str) -> CfgVal:
        """Parse the string form (``-cfg`` / ``.torchxconfig``) of this option."""
        if self.opt_type is bool:
            low = value.strip().lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"expected true or false, got {value!r}")
            return low in ("true", "1", "yes")
        if self.is_type_list_of_str:
            return _split_list(value)
        if self.is_type_dict_of_str:
            return _split_dict(value)
        if self.opt_type in (int, float):
            return self.opt_type(value)  # type: ignore[misc, call-arg]
        return value


class runopts:
    """The set of run options a scheduler accepts (``torchx runopts``)."""

    def __init__(self) -> None:
        self._opts: Dict[str, runopt] = {}

    def __iter__(self) -> Iterator[Tuple[str, runopt]]:
        return iter(self._opts.items())

    def __len__(self) -> int:
        return len(self._opts)

    def __contains__(self, key: str) -> bool:
        return key in self._opts

    @staticmethod
    def is_type(obj: CfgVal, tp: Type[CfgVal]) -> bool:
        """Whether ``obj`` matches ``tp`` (bool is not an int here; lists/dicts of str)."""
        if tp in (List[str], list):
            return isinstance(obj, list) and all(isinstance(x, str) for x in obj)
        if tp in (Dict[str, str], dict):
            return isinstance(obj, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in obj.items()
            )
        if tp is float:
            return isinstance(obj, (int, float)) and not isinstance(obj, bool)
        if tp is int:
            return isinstance(obj, int) and not isinstance(obj, bool)
        try:
            return isinstance(obj, tp)  # type: ignore[arg-type]
        except TypeError:
            return False

    def add(
        self,
        cfg_key: str,
        type_: Type[CfgVal],
        help: str,
        default: CfgVal = None,
        required: bool = False,
    ) -> None:
        if required and default is not None:
            raise ValueError(f"required option {cfg_key!r} cannot have a default ({default!r})")
        if default is not None and not runopts.is_type(default, type_):
            raise TypeError(
                f"option {cfg_key!r}: default {default!r} is not of type {get_type_name(type_)}"
            )
        self._opts[cfg_key] = runopt(default, type_, required, help)

    def get(self, name: str) -> Optional[runopt]:
        return self._opts.get(name)

    def update(self, other: runopts) -> None:
        self._opts.update(other._opts)

    def resolve(self, cfg: Mapping[str, CfgVal]) -> Dict[str, CfgVal]:
        """``cfg`` with defaults filled in; raises on a missing required key or a wrong type."""
        resolved: Dict[str, CfgVal] = dict(cfg)
        for key, opt in self._opts.items():
            val = resolved.get(key)
            if val is None:
                if opt.is_required:
                    raise InvalidRunConfigException(
                        f"Required run option {key!r} is missing; pass it with -cfg {key}=VALUE"
                        " or set it in .torchxconfig",
                        key,
                        cfg,
                    )
                resolved[key] = opt.default
            elif not runopts.is_type(val, opt.opt_type):
                if opt.opt_type is float and runopts.is_type(val, int):
                    resolved[key] = float(val)  # type: ignore[arg-type]
                    continue
                raise InvalidRunConfigException(
                    f"Run option {key!r} must be of type {get_type_name(opt.opt_type)},"
                    f" got {val!r} ({type(val).__name__})",
                    key,
                    cfg,
                )
        return resolved

    def unknown_keys(self, cfg: Mapping[str, CfgVal]) -> List[str]:
        return [k for k in cfg if k not in self._opts]

    def cfg_from_str(self, cfg_str: str) -> Dict[str, CfgVal]:
        """Parse ``"k=v,l=a;b,d=k1:v1;k2:v2"`` into typed values (no defaults applied).

        A value runs until the next ``,key=``; within it ``;`` (or ``,`` for
        list/dict options) separates items. Unknown keys raise, naming the known ones.
        """
        cfg: Dict[str, CfgVal] = {}
        if not cfg_str.strip():
            return cfg
        for key, raw in _split_cfg_pairs(cfg_str):
            opt = self._opts.get(key)
            if opt is None:
                known = ", ".join(sorted(self._opts)) or "(none)"
                raise InvalidRunConfigException(
                    f"Unknown run option {key!r}; valid options are: {known}", key, cfg_str
                )
            try:
                cfg[key] = opt.cast_to_type(raw)
            except ValueError as e:
                raise InvalidRunConfigException(
                    f"Run option {key!r} must be of type {get_type_name(opt.opt_type)}: {e}",
                    key,
                    cfg_str,
                ) from None
        return cfg

    def cfg_from_json_repr(self, json_repr: str) -> Dict[str, CfgVal]:
        """Parse a JSON object of options, checking keys and converting list/dict values."""
        data = json.loads(json_repr)
        cfg: Dict[str, CfgVal] = {}
        for key, val in data.items():
            opt = self._opts.get(key)
            if opt is None:
                raise InvalidRunConfigException(f"Unknown run option {key!r}", key, json_repr)
            if opt.is_type_list_of_str and isinstance(val, list):
                val = [str(v) for v in val]
            elif opt.is_type_dict_of_str and isinstance(val, dict):
                val = {str(k): str(v) for k, v in val.items()}
            cfg[key] = val
        return cfg

    def __repr__(self) -> str:
        required = [(k, o) for k, o in self._opts.items() if o.is_required]
        optional = [(k, o) for k, o in self._opts.items() if not o.is_required]
        lines = []
        usage = [f"{k}={k.upper()}" for k, _ in required] + [
            f"[{k}={k.upper()}]" for k, _ in optional
        ]
        lines.append("    usage:\n        " + ",".join(usage))
        if required:
            lines.append("\n    required arguments:")
            for k, o in required:
                lines.append(
                    f"        {k}={k.upper()} ({get_type_name(o.opt_type)})\n            {o.help}"
                )
        if optional:
            lines.append("\n    optional arguments:")
            for k, o in optional:
                lines.append(
                    f"        {k}={k.upper()} ({get_type_name(o.opt_type)}, {o.default})\n"
                    f"            {o.help}"
                )
        return "\n".join(lines)


def _split_cfg_pairs(cfg_str: str) -> List[Tuple[str, str]]:
    """Split ``k=v,k2=a,b;c`` into pairs; a comma not followed by ``key=`` belongs to the value."""
    pairs: List[Tuple[str, str]] = []
    for chunk in re.split(r",(?=\s*[\w.\-]+\s*=)", cfg_str.strip()):
        if not chunk.strip():
            continue
        if "=" not in chunk:
            raise InvalidRunConfigException(
                f"Malformed run config {chunk!r}; expected KEY=VALUE[,KEY=VALUE...]", chunk, cfg_str
            )
        k, v = chunk.split("=", 1)
        if not k.strip():
            raise InvalidRunConfigException(f"Missing key in run config {chunk!r}", chunk, cfg_str)
        pairs.append((k.strip(), v.strip()))
    return pairs


class AppDryRunInfo(Generic[T]):
    """What a scheduler would submit (``request``), printable via ``fmt``."""

    def __init__(self, request: T, fmt: Callable[[T], str]) -> None:
        self.request = request
        self._fmt = fmt
        self._app: Optional[AppDef] = None
        self._cfg: Mapping[str, CfgVal] = {}
        self._scheduler: Optional[str] = None

    def __repr__(self) -> str:
        return self._fmt(self.request)


# --------------------------------------------------------------------------- handles

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


# --------------------------------------------------------------------------- mounts

_MOUNT_KEY_ALIASES = {
    "source": "src",
    "destination": "dst",
    "target": "dst",
    "read_only": "readonly",
}


def parse_mounts(opts: List[str]) -> List[Union[BindMount, VolumeMount, DeviceMount]]:
    """Parse docker-style mount options, e.g. ``["type=bind,src=/a,dst=/b,readonly"]``.

    Each mount starts with ``type=bind|volume|device``; items may be split across
    list elements (``["type=bind", "src=/a", "dst=/b"]``).
    """
    groups: List[Dict[str, str]] = []
    for opt in opts:
        for item in filter(None, (p.strip() for p in opt.split(","))):
            key, _, value = item.partition("=")
            key = _MOUNT_KEY_ALIASES.get(key.strip(), key.strip())
            if key == "type":
                groups.append({"type": value})
            elif not groups:
                raise InvalidArgumentError(
                    f"mount option {item!r} must follow a type=bind|volume|device item"
                )
            else:
                groups[-1][key] = value if _ else "true"
    mounts: List[Union[BindMount, VolumeMount, DeviceMount]] = []
    for g in groups:
        kind = g.get("type", "")
        readonly = g.get("readonly", "false").lower() in ("true", "1", "")
        try:
            if kind == MountType.BIND:
                mounts.append(BindMount(os.path.expanduser(g["src"]), g["dst"], readonly))
            elif kind == MountType.VOLUME:
                mounts.append(VolumeMount(g["src"], g["dst"], readonly))
            elif kind == MountType.DEVICE:
                src = g["src"]
                mounts.append(DeviceMount(src, g.get("dst", src), g.get("perm", "rwm")))
            else:
                raise InvalidArgumentError(
                    f"unknown mount type {kind!r}; use type=bind, type=volume or type=device"
                )
        except KeyError as e:
            raise InvalidArgumentError(
                f"mount {','.join(f'{k}={v}' for k, v in g.items())} is missing {e.args[0]}="
            ) from None
    return mounts
