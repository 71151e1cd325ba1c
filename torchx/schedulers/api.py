"""The contract every scheduler implements, and helpers they share.

A scheduler turns an ``AppDef`` into a request for its backend (``submit_dryrun``),
submits it (``schedule``), and answers ``describe``/``list``/``log_iter``/``cancel``
for app ids it issued. It knows nothing of the runner or the CLI.
"""

from __future__ import annotations

import abc
import functools
import logging
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Generic,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    TypeVar,
    Union,
)

from torchx.schedulers.ids import keyed_name
from torchx.specs.api import (
    MISSING,
    NONE,
    NULL_RESOURCE,
    AppDef,
    AppDryRunInfo,
    AppState,
    CfgVal,
    Role,
    RoleStatus,
    TorchXError,
    is_terminal,
    make_app_handle,
    runopts,
)
from torchx.specs.names import validate_app_names
from torchx.workspace.api import Workspace, WorkspaceMixin, apply_workspace

if TYPE_CHECKING:  # annotations only: a CLI run need not load datetime
    from datetime import datetime

__all__ = [
    "DescribeAppResponse",
    "IDEMPOTENCY_TOKEN",
    "OWNER",
    "InvalidAppError",
    "ListAppResponse",
    "Scheduler",
    "Stream",
    "WorkspaceMixin",
    "GenerationTaken",
    "app_idempotency_token",
    "cancel_loser",
    "filter_regex",
    "idempotency_token",
    "split_lines",
    "split_lines_iterator",
    "validate_env_names",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")  # the scheduler's request type

# AppDef.metadata key of a submission's idempotency token, which each scheduler stores with
# the job (local request, Slurm comment, Kubernetes label, Batch tag, Ray metadata).
IDEMPOTENCY_TOKEN = "torchx.idempotency_token"
# key of the job's owner (the orchestrator task that submitted it; torchx.pipelines.owner)
OWNER = "torchx.owner"


def idempotency_token(key: str) -> str:
    """The stored form of an idempotency key: ``tx`` + 40 hex digits of its sha256.

    Short and plain enough for every backend (a Kubernetes label value, a Slurm comment,
    a Batch tag), and it does not leak the key's text (which may name a DAG or a run).
    """
    import hashlib

    return "tx" + hashlib.sha256(key.encode()).hexdigest()[:40]


def app_idempotency_token(app: AppDef) -> Optional[str]:
    """The token the Runner put on ``app`` (None for a submission without a key)."""
    return app.metadata.get(IDEMPOTENCY_TOKEN) or None


# beside the token: how many apps of it the Runner's lookup found (all ended), so a
# scheduler whose backend enforces unique names can name the app after both (``keyed_app_id``)
IDEMPOTENCY_GENERATION = "torchx.idempotency_generation"


def keyed_app_id(app: AppDef) -> Optional[str]:
    """The app id of a keyed submission, ``{name}-{token hash}-{generation}`` (None without
    a key): racers that saw the same apps pick the same id, and the backend takes one."""
    token, generation = app_idempotency_token(app), app.metadata.get(IDEMPOTENCY_GENERATION)
    return keyed_name(app.name, token, generation) if token and generation else None


def stored_app(app: AppDef) -> AppDef:
    """``app`` as a job keeps it: the generation is the dry run's input only."""
    meta = {k: v for k, v in app.metadata.items() if k != IDEMPOTENCY_GENERATION}
    return AppDef(app.name, app.roles, meta)


class GenerationTaken(Exception):
    """A keyed submission's app id is an ended app's that the caller may not reuse (its
    lookup was stale): submit again as ``generation``."""

    def __init__(self, generation: int) -> None:
        super().__init__(
            "the app id of this keyed submission is taken by an ended app of its key;"
            " submit it again"
        )
        self.generation = generation


# ``Runner.run(stall_timeout=S)``'s S (seconds), kept with the job like the token
STALL_TIMEOUT = "torchx.stall_timeout"


def app_stall_timeout(app: AppDef) -> Optional[float]:
    """The stall timeout the Runner put on ``app`` (None: no stall detection)."""
    value = app.metadata.get(STALL_TIMEOUT)
    return float(value) if value else None


class Stream(str, Enum):
    STDOUT = "stdout"
    STDERR = "stderr"
    COMBINED = "combined"


@dataclass
class DescribeAppResponse:
    """What a scheduler knows about one app."""

    app_id: str = "<NOT_SET>"
    state: AppState = AppState.UNSUBMITTED
    num_restarts: int = -1
    msg: str = NONE
    structured_error_msg: str = NONE
    ui_url: Optional[str] = None
    metadata: Dict[str, str] = field(default_factory=dict)
    roles_statuses: List[RoleStatus] = field(default_factory=list)
    roles: List[Role] = field(default_factory=list)


@dataclass(unsafe_hash=True)
class ListAppResponse:
    app_id: str
    state: AppState
    app_handle: str = "<NOT_SET>"
    name: str = ""


class InvalidAppError(TorchXError, ValueError):
    """An AppDef a scheduler cannot run (no resource, no roles, ...)."""


# a name every scheduler's env carries (a shell variable, ``env NAME=value``, a Kubernetes
# or Batch env entry): anything else fails only once the job runs, or on some schedulers
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def validate_env_names(app: AppDef) -> None:
    """Refuse an env var name that is not an identifier (``"BAD NAME"``, ``"A=B"``, ``"1X"``)
    at submit, on every scheduler, instead of at run time on some of them."""
    for role in app.roles:
        for name in role.env:
            if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
                raise InvalidAppError(
                    f"env var name {name!r} of role {role.name!r} is not valid: use letters,"
                    " digits and '_', not starting with a digit (e.g. --env MY_VAR=1)"
                )


def validate_app(app: AppDef) -> None:
    """What every scheduler needs of an app: roles, each with an entrypoint and replicas,
    and env names it can carry."""
    if not app.roles:
        raise InvalidAppError(f"app {app.name!r} has no roles; add at least one Role")
    for role in app.roles:
        if not role.entrypoint or role.entrypoint == MISSING:
            raise InvalidAppError(f"role {role.name!r} of app {app.name!r} has no entrypoint")
        if role.num_replicas <= 0:
            raise InvalidAppError(
                f"role {role.name!r} of app {app.name!r} has num_replicas={role.num_replicas};"
                " it must be > 0"
            )
    validate_env_names(app)


class Scheduler(abc.ABC, Generic[T]):
    """Base class of all schedulers (``local_cwd``, ``slurm``, ``kubernetes``, ...)."""

    def __init__(self, backend: str, session_name: str) -> None:
        self.backend = backend
        self.session_name = session_name

    def close(self) -> None:
        """Release resources held by this object (never kills jobs submitted through it)."""

    def submit(
        self,
        app: AppDef,
        cfg: Mapping[str, CfgVal],
        workspace: Optional[Union[Workspace, str]] = None,
    ) -> str:
        """Build ``workspace`` (if any) into ``roles[0]``, dry-run, then schedule ``app``;
        returns the scheduler's app id. Meant for tests and scripts (the Runner does more)."""
        resolved = self.run_opts().resolve(cfg, self.backend)
        apply_workspace(self, app, workspace, resolved)
        return self.schedule(self.submit_dryrun(app, resolved))

    @abc.abstractmethod
    def schedule(self, dryrun_info: AppDryRunInfo[T]) -> str:
        """Submit a request made by ``submit_dryrun``; returns the app id."""

    def submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[T]:
        """The exact request ``schedule`` would submit, without submitting it."""
        resolved = self.run_opts().resolve(cfg, self.backend)
        validate_app_names(app)
        validate_env_names(app)  # here, not in _validate: a scheduler may override that
        _call_validate(self, app, resolved)
        info = self._submit_dryrun(app, resolved)
        for role in app.roles:
            info = role.pre_proc(self.backend, info)
        info._app = app
        info._cfg = resolved
        info._scheduler = self.backend
        return info

    @abc.abstractmethod
    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[T]: ...

    def run_opts(self) -> runopts:
        """The scheduler's run options, plus the workspace options of a ``WorkspaceMixin``."""
        opts = self._run_opts()
        if isinstance(self, WorkspaceMixin):
            opts.update(self.workspace_opts())
        return opts

    def _run_opts(self) -> runopts:
        return runopts()

    @abc.abstractmethod
    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        """The app's state, or None if this scheduler does not know the id."""

    @abc.abstractmethod
    def list(self) -> List[ListAppResponse]:
        """Apps this scheduler knows about."""

    # Keyed submission (``Runner.run(..., idempotency_key=K)``): the two hooks below are
    # the whole contract. The Runner hands the key's token (``idempotency_token``) to the
    # dry run in ``app.metadata``; the scheduler stores it with the job, so any process
    # finds the token's apps. The token's oldest live app is its app: a caller re-attaches
    # to it, and of racing submitters only its submitter keeps what it launched. Where the
    # backend refuses a second job under one name, that refusal is the claim; elsewhere
    # racers reconcile after the fact (the default ``schedule_keyed``). The Runner also hands
    # the number of the token's apps it found (all ended) as the generation: Ray and
    # local_docker (Kubernetes too) name the app ``keyed_app_id``; the backend's refusal of a name
    # is the claim (``schedule_named``), so a racing loser never starts its command; such a
    # scheduler sets ``names_keyed_apps`` (only it is handed the generation).
    names_keyed_apps = False

    def find_by_idempotency_token(
        self, token: str, cfg: Optional[Mapping[str, CfgVal]] = None
    ) -> List[ListAppResponse]:
        """Apps submitted with ``token`` (with ``cfg``: where such a submission went, e.g.
        its Kubernetes namespace), oldest first: the backend's own submission order (job
        id, creation time), the app id breaking ties, so every process gets one order."""
        raise NotImplementedError(f"{self.backend} does not support idempotent submission")

    def schedule_keyed(
        self, token: str, dryrun_info: AppDryRunInfo[T], reattach_succeeded: bool
    ) -> tuple[str, Optional[str]]:
        """Schedule ``dryrun_info`` as the app of ``token`` unless another submission holds
        the token; returns (the token's app id, the id of the app this call launched, None
        if none). A launched app that lost the token is cancelled here (a warning if it
        cannot be). The holder found may be SUCCEEDED only with ``reattach_succeeded``.

        With ``names_keyed_apps`` the backend's refusal of the app id is the claim
        (``schedule_named``). Else schedule, then the oldest live app of the token wins, so
        a racing loser may start its command before it is cancelled."""
        app = dryrun_info.app
        app_id = keyed_app_id(app) if app and self.names_keyed_apps else None
        if app_id:
            taken = self._name_taken
            return schedule_named(self, token, dryrun_info, reattach_succeeded, app_id, taken)
        ours = self.schedule(dryrun_info)
        listed = self.find_by_idempotency_token(token, dryrun_info.cfg)
        ended = {a.app_id for a in listed if is_terminal(a.state)}
        live = [a.app_id for a in listed if a.app_id not in ended]
        winner = live[0] if live else ours  # ours may not be listed yet
        if winner != ours and ours not in ended:
            handle_of = functools.partial(make_app_handle, self.backend, self.session_name)
            cancel_loser(handle_of(ours), handle_of(winner), functools.partial(self.cancel, ours))
        return winner, ours

    def _name_taken(self, e: Exception) -> bool:
        """With ``names_keyed_apps``: whether ``schedule`` failed because the backend holds
        a job under the keyed app id already."""
        return False

    def exists(self, app_id: str) -> bool:
        return self.describe(app_id) is not None

    @abc.abstractmethod
    def _cancel_existing(self, app_id: str) -> None: ...

    def cancel(self, app_id: str) -> None:
        """Cancel the app if it exists (idempotent)."""
        if self.exists(app_id):
            self._cancel_existing(app_id)

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
        """Lines (with their ``\\n``) of replica ``k`` of ``role_name``."""
        raise NotImplementedError(f"{self.backend} does not support log_iter")

    def wait_for_change(self, app_id: str, timeout: float) -> None:
        """Block up to ``timeout`` s or until the app's state may have changed (the default
        sleeps; a scheduler that notices an end sooner lets ``Runner.wait`` return then)."""
        import time

        time.sleep(timeout)

    def progress_path(self, app_id: str) -> Optional[str]:
        """The file the app's progress reports go to, if this scheduler gives one."""
        return None

    def _pre_build_validate(self, app: AppDef, scheduler: str, cfg: Mapping[str, CfgVal]) -> None:
        """Checks that must pass before a workspace is built."""

    def _validate(
        self, app: AppDef, scheduler: str, cfg: Optional[Mapping[str, CfgVal]] = None
    ) -> None:
        """Raise ``InvalidAppError`` (a ``ValueError``) if the app cannot run here. ``cfg`` is
        optional: upstream 0.7.0's signature is ``_validate(app, scheduler)``."""
        for role in app.roles:
            if role.resource == NULL_RESOURCE:
                raise InvalidAppError(
                    f"No resource for role: {role.image}."
                    " Did you forget to attach resource to the role?"
                )


def _call_validate(sched: Scheduler[Any], app: AppDef, cfg: Mapping[str, CfgVal]) -> None:
    """``sched._validate(app, backend, cfg)``; without ``cfg`` for a plugin that overrides it
    with upstream 0.7.0's two-argument signature."""
    import inspect

    try:
        params = list(inspect.signature(sched._validate).parameters.values())
    except (TypeError, ValueError):  # no signature to read: called as ours
        params = []
    if 0 < len(params) < 3 and all(p.kind != p.VAR_POSITIONAL for p in params):
        sched._validate(app, sched.backend)
    else:
        sched._validate(app, sched.backend, cfg)


def filter_regex(regex: Optional[str], lines: Iterable[str]) -> Iterator[str]:
    """Only the lines matching ``regex`` (all lines when it is None)."""
    if not regex:
        yield from lines
        return
    pattern = re.compile(regex)
    for line in lines:
        if pattern.search(line):
            yield line


def split_lines(text: str) -> List[str]:
    return text.splitlines(keepends=True)


def split_lines_iterator(chunks: Iterable[str]) -> Iterator[str]:
    """Re-chunk a stream of text pieces into whole lines (a trailing partial line is flushed)."""
    buf = ""
    for chunk in chunks:
        *lines, buf = (buf + chunk).split("\n")
        yield from (line + "\n" for line in lines)
    if buf:
        yield buf


def schedule_named(
    sched: Scheduler[T],
    token: str,
    dryrun_info: AppDryRunInfo[T],
    reattach_succeeded: bool,
    app_id: str,
    taken: Callable[[Exception], bool],
) -> tuple[str, Optional[str]]:
    """``schedule_keyed`` where the backend refuses a second job under one name (``taken``
    tells that refusal) and ``dryrun_info`` names the app ``app_id`` (``keyed_app_id``): a
    refused submitter launched nothing and re-attaches to the token's oldest live app (its
    newest SUCCEEDED only with ``reattach_succeeded``); if none, its lookup was stale:
    ``GenerationTaken``."""
    import time

    try:
        ours = sched.schedule(dryrun_info)
        return ours, ours
    except Exception as e:  # the backend's own error types; only its refusal is handled
        if not taken(e):
            raise
    # a name is reserved before its job is listed (Docker): wait until the holder shows
    deadline = time.monotonic() + 30
    listed = sched.find_by_idempotency_token(token, dryrun_info.cfg)
    while app_id not in {a.app_id for a in listed} and time.monotonic() < deadline:
        time.sleep(0.1)
        listed = sched.find_by_idempotency_token(token, dryrun_info.cfg)
    live = [a.app_id for a in listed if not is_terminal(a.state)]
    done = [a.app_id for a in listed if reattach_succeeded and a.state == AppState.SUCCEEDED]
    if live:
        return live[0], None
    if done:
        return done[-1], None
    raise GenerationTaken(len(listed))


def cancel_loser(loser: str, winner: str, cancel: Callable[[], None]) -> bool:
    """Cancel a keyed submission that lost its token to ``winner``; False (and a warning
    naming it) if that failed: the caller still gets the winner."""
    logger.info("%s lost a submission race to %s: cancelling it", loser, winner)
    try:
        cancel()
        return True
    except Exception as e:  # any scheduler's failure: the caller still gets the winner
        logger.warning(
            "could not cancel %s, a duplicate of %s (%s); cancel it with: torchx cancel %s",
            *(loser, winner, e, loser),
        )
        return False
