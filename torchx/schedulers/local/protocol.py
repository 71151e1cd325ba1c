"""What the ``local_cwd`` scheduler and its supervisor agree on: the files of an app's
directory, the typed records written there, the states and their transitions, and the
lock every writer holds. Stdlib only: the supervisor imports it.

An app directory holds ``request.json`` (a ``Request``, written once by the launcher),
``state.json`` (a ``State``, replaced atomically on every change), ``supervisor.pid``
(``PID STAMP``, written once its signal handlers are installed), ``cancel``,
``state.lock`` and ``progress.json`` (rank 0's last progress report). Directories are
0700 and files 0600: the request holds the replicas' environment, which may hold secrets.
Every open is ``O_NOFOLLOW`` and every file written aside is new (``O_EXCL``, a random
name), so a symlink planted in the directory never redirects a read or a write.

The state only moves forward (``may_follow``): every writer goes through ``transition``
under ``state.lock``, so the first terminal state stays. Readers never write.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
import typing
from typing import Any, Callable, Dict, Iterator, List, Optional, TypedDict

REQUEST = "request.json"
STATE = "state.json"
PID = "supervisor.pid"
CANCEL = "cancel"
LOCK = "state.lock"
SUPERVISOR_LOG = "supervisor.log"
PROGRESS = "progress.json"  # rank 0's last ``report_progress`` (torchx.runtime.progress)

# cancel: SIGTERM to every process of the app, SIGKILL to what still runs this much later
GRACE_SECONDS = 5.0
# a request whose supervisor has not published its pid this long after submission never
# runs: readers report it FAILED, and a supervisor that starts later refuses to run it
LAUNCH_TIMEOUT = 60.0
NEVER_STARTED = "the local supervisor never started"

DIR_MODE = 0o700
FILE_MODE = 0o600

# the states of an app and of a replica (``torchx.specs.AppState`` names)
PENDING = "PENDING"
RUNNING = "RUNNING"
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
STATES = frozenset({PENDING, RUNNING}) | TERMINAL


def may_follow(current: Optional[str], new: str) -> bool:
    """Whether the state on disk may go from ``current`` (None: none yet) to ``new``."""
    if current is None:
        return True
    if current in TERMINAL:
        return False
    return not (current == RUNNING and new == PENDING)


class RoleSpec(TypedDict):
    """Retries of one role, as the supervisor applies them."""

    max_retries: int
    retry_policy: str  # torchx.specs.RetryPolicy name: APPLICATION, ROLE or REPLICA
    min_replicas: int


class ReplicaSpec(TypedDict):
    """How to start one replica and where its output goes."""

    role: str
    replica_id: int
    args: List[str]
    env: Dict[str, str]
    cwd: str
    stdout: str
    stderr: str
    combined: str
    error_file: str


class Request(TypedDict):
    """``request.json``: what to run, written once by the launcher."""

    app_id: str
    log_dir: str
    app: Dict[str, Any]  # the AppDef as ``torchx.specs.serialize.appdef_to_dict`` writes it
    roles: Dict[str, RoleSpec]
    replicas: List[ReplicaSpec]
    idempotency_token: Optional[str]
    stall_timeout: Optional[float]
    submitted: float  # time.time()


class ReplicaState(TypedDict):
    role: str
    id: int
    pid: Optional[int]
    stamp: Optional[str]  # tells ``pid`` apart from a later process with the same pid
    state: str
    exit_code: Optional[int]


class _StateName(TypedDict):
    state: str


class State(_StateName, total=False):
    """``state.json``: the app's state (only ``state`` is always there)."""

    msg: str
    num_restarts: int
    supervisor_pid: int
    replicas: List[ReplicaState]
    started: float
    updated: float


class BadRecord(ValueError):
    """A request or state file with content we did not write (``{}``, a state named
    ``BOGUS``, garbage from a full disk or a hand edit)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


_Check = Callable[[Any, str], Optional[str]]


@functools.cache
def _checker(tp: Any) -> _Check:
    """What is wrong with a JSON value as a ``tp`` at ``where`` (None: nothing): a check
    built once per type, since a poll checks a thousand apps' records."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return lambda value, where: None
    if origin is typing.Union:
        options = [_checker(a) for a in args]

        def one_of(value: Any, where: str) -> Optional[str]:
            if any(check(value, where) is None for check in options):
                return None
            return f"bad {where!r}"

        return one_of
    if typing.is_typeddict(tp):
        required = tuple(tp.__required_keys__)
        fields = [(k, _checker(sub)) for k, sub in typing.get_type_hints(tp).items()]

        def record(value: Any, where: str) -> Optional[str]:
            if not isinstance(value, dict):
                return f"{where} is not a JSON object" if where else "not a JSON object"
            for key in required:
                if key not in value:
                    return f"no {_join(where, key)!r}"
            for key, check in fields:
                if key in value and (problem := check(value[key], _join(where, key))):
                    return problem
            return None

        return record
    if origin in (list, dict):
        item = _checker(args[-1])  # the items' type is the last argument of List and Dict

        def items(value: Any, where: str) -> Optional[str]:
            if origin is list and isinstance(value, list):
                found = ((f"{where}[{i}]", v) for i, v in enumerate(value))
            elif (
                origin is dict
                and isinstance(value, dict)
                and all(isinstance(k, str) for k in value)
            ):
                found = ((_join(where, k), v) for k, v in value.items())
            else:
                return f"bad {where!r}"
            return next(filter(None, (item(v, at) for at, v in found)), None)

        return items
    if tp in (int, float):  # JSON numbers: a bool is not one, an int is a float
        kinds = (int, float) if tp is float else (int,)
        return lambda value, where: (
            None if isinstance(value, kinds) and not isinstance(value, bool) else f"bad {where!r}"
        )
    return lambda value, where: None if isinstance(value, tp) else f"bad {where!r}"


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def load_request(app_dir: str) -> Optional[Request]:
    """The app's request (None if there is none: no such app); ``BadRecord`` if bad."""
    path = os.path.join(app_dir, REQUEST)
    doc = _read_record(path, Request)
    if doc is not None:
        app = doc["app"]
        roles = app.get("roles")
        ok = (
            isinstance(app.get("name"), str)
            and isinstance(roles, list)
            and all(
                isinstance(r, dict)
                and isinstance(r.get("name"), str)
                and isinstance(r.get("num_replicas"), int)
                for r in roles
            )
        )
        if not ok:
            raise BadRecord(path, "no valid 'app' (name and roles)")
    return typing.cast(Optional[Request], doc)


def load_state(app_dir: str) -> Optional[State]:
    """The app's state (None before anyone wrote one); ``BadRecord`` if bad."""
    path = os.path.join(app_dir, STATE)
    doc = _read_record(path, State)
    if doc is not None and doc["state"] not in STATES:
        raise BadRecord(path, f"unknown state {doc['state']!r}")
    if doc is not None and any(r["state"] not in STATES for r in doc.get("replicas", [])):
        raise BadRecord(path, "bad 'replicas' (unknown state)")
    return typing.cast(Optional[State], doc)


def current_state(app_dir: str) -> Optional[State]:
    """The state if it is readable and valid, else None (for writers deciding a move)."""
    try:
        return load_state(app_dir)
    except BadRecord:
        return None


def read_supervisor(app_dir: str) -> Optional[tuple[int, str]]:
    """``(pid, stamp)`` of the app's supervisor; None before it started."""
    try:
        pid_s, stamp = read_private(os.path.join(app_dir, PID)).decode().split()
        return int(pid_s), stamp
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return (0, "")  # unreadable: treated as a supervisor that is gone


def _read_record(path: str, tp: Any) -> Optional[Any]:
    """The parsed file; None if it does not exist; ``BadRecord`` if it is unreadable, not
    JSON, or not a ``tp``."""
    try:
        data = read_private(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise BadRecord(path, f"cannot read it ({e.strerror})") from None
    if problem := _record_problem(data, tp):
        raise BadRecord(path, problem)
    return json.loads(data)


@functools.lru_cache(maxsize=4096)
def _record_problem(data: bytes, tp: Any) -> Optional[str]:
    """What is wrong with ``data`` as JSON of type ``tp`` (None: nothing), remembered by
    content: a poll reads every app's records, and most have not changed since the last."""
    try:
        doc = json.loads(data)
    except ValueError:
        return "it is not valid JSON"
    return _checker(tp)(doc, "")


def makedirs_private(path: str) -> None:
    """``mkdir -p`` creating each missing directory 0700 (existing ones are left alone)."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return
    makedirs_private(os.path.dirname(path))
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return
    os.chmod(path, DIR_MODE)  # mkdir's mode is masked by the umask


def open_private(path: str, flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> int:
    """A file descriptor of ``path``, created 0600; a symlink there is not followed (ELOOP)."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)


def read_private(path: str) -> bytes:
    """The content of ``path``; a symlink there is not followed (ELOOP)."""
    with os.fdopen(open_private(path, os.O_RDONLY), "rb") as f:
        return f.read()


def write_atomic(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` so that readers see the old or the new file, never half:
    written aside to a new file of a random name, then renamed over ``path``."""
    tmp = f"{path}.tmp.{os.urandom(8).hex()}"
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(app_dir: str) -> Iterator[None]:
    """Hold the app's state lock (across processes)."""
    import fcntl

    fd = open_private(os.path.join(app_dir, LOCK), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def transition(app_dir: str, doc: State) -> State:
    """Write ``doc`` as the app's state if ``may_follow`` allows it.

    Returns the state on disk afterwards (``doc``, or the state that stays).
    """
    with locked(app_dir):
        return transition_locked(app_dir, doc)


def transition_locked(app_dir: str, doc: State) -> State:
    """``transition`` for a caller that already holds ``locked(app_dir)``."""
    cur = current_state(app_dir)
    if cur is not None and not may_follow(cur["state"], doc["state"]):
        return cur
    write_atomic(os.path.join(app_dir, STATE), json.dumps(doc))
    return doc


def with_state(doc: Optional[State], state: str, msg: str) -> State:
    """``doc`` (if any) with ``state`` and ``msg``."""
    new: State = {"state": state, "replicas": []}
    if doc is not None:
        new.update(doc)
    new["state"], new["msg"] = state, msg
    return new


def finalize(app_dir: str, state: str, msg: str, locked: bool = False) -> State:
    """Record a terminal state decided outside the supervisor's run; returns the state on
    disk (an earlier terminal state wins)."""
    doc = with_state(current_state(app_dir), state, msg)
    doc["updated"] = time.time()
    if locked:
        return transition_locked(app_dir, doc)
    return transition(app_dir, doc)


def end_unstarted(app_dir: str, request: Request) -> None:
    """End an app whose replicas never started (the caller holds the lock): FAILED past
    ``LAUNCH_TIMEOUT``, as readers report it by then, else CANCELLED."""
    if time.time() - request["submitted"] > LAUNCH_TIMEOUT:
        finalize(app_dir, FAILED, NEVER_STARTED, locked=True)
    else:
        finalize(app_dir, CANCELLED, "cancelled before it started", locked=True)


def is_terminal_on_disk(app_dir: str) -> bool:
    cur = current_state(app_dir)
    return cur is not None and cur["state"] in TERMINAL
