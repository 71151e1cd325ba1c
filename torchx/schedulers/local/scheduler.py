"""``LocalScheduler``: the ``Scheduler`` of ``local_cwd`` (how it works: the package doc).

``launch``, ``control``, ``claims`` and ``logs`` are imported by the methods that use
them: a dry run, which every ``torchx run`` starts with, needs none of them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple, cast

from torchx.runtime.progress import ENV_PROGRESS_FILE
from torchx.schedulers.api import (
    DescribeAppResponse,
    InvalidAppError,
    ListAppResponse,
    Scheduler,
    Stream,
    app_idempotency_token,
    app_stall_timeout,
)
from torchx.schedulers.ids import unique_name
from torchx.schedulers.local import protocol as files
from torchx.schedulers.local.images import (
    CWDImageProvider,
    ImageProvider,
    LocalOpts,
    ReplicaParam,
    _join_PATH,
    check_entrypoint,
    cuda_device_count,
    search_path,
    set_cuda_visible_devices,
)
from torchx.schedulers.local.protocol import BadRecord, ReplicaSpec, Request, RoleSpec, State
from torchx.schedulers.ports import rdzv_port_for
from torchx.specs.api import (
    NONE,
    AppDef,
    AppDryRunInfo,
    AppState,
    CfgVal,
    ReplicaStatus,
    Role,
    RoleStatus,
    TorchXError,
    macros,
    runopts,
)
from torchx.util.paths import state_dir
from torchx.workspace.dir_workspace import LocalDirWorkspaceMixin, workspace_dir

if TYPE_CHECKING:
    from datetime import datetime

    from torchx.schedulers.local.launch import Started
    from torchx.schedulers.local.logs import LogLines

log = logging.getLogger(__name__)  # upstream's name for this module's logger

GRACE_SECONDS = files.GRACE_SECONDS
STDOUT_LOG = "stdout.log"
STDERR_LOG = "stderr.log"
COMBINED_LOG = "combined.log"
ERROR_FILE = "error.json"
RANK0_ENV = "TORCHX_RANK0_HOST"
POLL_SECONDS = 0.01
TOKENS_DIR = ".tokens"


class UnreadableAppError(TorchXError):
    """A local app whose files cannot be understood (``protocol.BadRecord``): ``status``
    says so in one line, ``list`` skips the app with a warning."""

    def __init__(self, app_id: str, path: str, reason: str) -> None:
        super().__init__(
            f"local_cwd app {app_id} is unreadable: {path}: {reason}"
            " (remove its directory if the app is of no use)"
        )
        self.app_id = app_id
        self.path = path


@dataclass
class PopenRequest:
    """What ``local_cwd`` runs for an app: per role, one ``ReplicaParam`` per replica."""

    app_id: str
    log_dir: str
    role_params: Dict[str, List[ReplicaParam]] = field(default_factory=dict)
    role_log_dirs: Dict[str, List[str]] = field(default_factory=dict)
    app: Dict[str, Any] = field(default_factory=dict)
    idempotency_token: Optional[str] = None
    stall_timeout: Optional[float] = None


def _format_request(req: PopenRequest) -> str:
    lines = [f"app_id: {req.app_id}", f"log_dir: {req.log_dir}"]
    if req.stall_timeout:
        lines.append(f"stall_timeout: {req.stall_timeout:g} s")
    for role, params in req.role_params.items():
        for i, p in enumerate(params):
            lines.append(f"{role}/{i}:")
            lines.append(f"  cmd: {shlex.join(p.args)}")
            lines.append(f"  cwd: {p.cwd}")
            for k, v in sorted(p.env.items()):
                if k != "PATH":
                    lines.append(f"  env: {k}={v}")
            lines.append(f"  logs: {os.path.dirname(p.combined or '')}")
    return "\n".join(lines)


class LocalScheduler(LocalDirWorkspaceMixin, Scheduler[PopenRequest]):
    """Runs replicas as local processes, in a copy of the workspace unless it is the current
    directory. Apps outlive the process that launched them (upstream's ``close()`` kills
    them; this one does not): stop one with ``cancel``.
    """

    def __init__(
        self,
        session_name: str,
        image_provider_class: Callable[[LocalOpts], ImageProvider] = CWDImageProvider,
        cache_size: int = 100,
        extra_paths: Optional[List[str]] = None,
        torchx_home: Optional[str] = None,
    ) -> None:
        super().__init__("local_cwd", session_name)
        self._torchx_home = torchx_home  # None: $TORCHX_HOME
        if cache_size <= 0:
            raise ValueError("cache size must be greater than zero")
        self._image_provider_class = image_provider_class
        self._cache_size = cache_size  # upstream's LRU size (its tests read it); all apps are kept
        self._extra_paths = extra_paths or []
        # parsed requests by app id, with the file's stat key: a request is written once,
        # so a poller's list of N apps re-reads N states but parses no request twice
        self._requests: Dict[str, Tuple[Tuple[int, int], Request]] = {}

    def close(self) -> None:
        """Reaps forked supervisors that exited; apps and their files live on."""
        launch = sys.modules.get("torchx.schedulers.local.launch")
        if launch is not None:  # not imported: this process started no supervisor
            launch.reap_forked()

    def build_workspace_and_update_role(
        self, role: Role, workspace: str, cfg: Mapping[str, CfgVal]
    ) -> None:
        """Copy a workspace for the role to run in, unless it is the current directory
        (the CLI's default), which is decided here without loading fsspec (0.2 s)."""
        path = workspace[len("file://") :] if workspace.startswith("file://") else workspace
        if "://" not in path and os.path.isdir(path):
            if os.path.realpath(path) == os.path.realpath(os.getcwd()):
                return
        super().build_workspace_and_update_role(role, workspace, cfg)

    def _state_root(self) -> Path:
        """The session's folder, each level from ``$TORCHX_HOME`` down checked first
        (``torchx.util.paths.state_dir``): ``UnsafeStateRootError`` if another user can
        write one, before anything in it is read or signalled."""
        return state_dir("local_cwd", self.session_name, given=self._torchx_home)

    def _app_dir(self, app_id: str) -> Path:
        return self._state_root() / app_id

    def _run_opts(self) -> runopts:
        opts = runopts()
        opts.add(
            "log_dir",
            type_=str,
            default=None,
            help="dir to write stdout/stderr log files of replicas"
            " (default: under $TORCHX_HOME/local_cwd)",
        )
        opts.add(
            "prepend_cwd",
            type_=bool,
            default=False,
            help="if set, prepends CWD to replica's PATH env var making any binaries in CWD"
            " take precedence over those in PATH",
        )
        opts.add(
            "auto_set_cuda_visible_devices",
            type_=bool,
            default=False,
            help="sets the `CUDA_AVAILABLE_DEVICES` for roles that request GPU resources."
            " Each role replica will be assigned one GPU."
            " Does nothing if the device count is less than replicas.",
        )
        return opts

    def _validate(
        self, app: AppDef, scheduler: str, cfg: Optional[Mapping[str, CfgVal]] = None
    ) -> None:
        """Local runs need no resources; entrypoints must exist (checked at submit, not at run)."""

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[PopenRequest]:
        from torchx.specs.serialize import appdef_to_dict

        app_id = unique_name(app.name, max_base=40, suffix_length=10)
        default_root = state_dir("local_cwd", given=self._torchx_home)
        log_root = os.path.abspath(os.path.expanduser(str(cfg.get("log_dir") or default_root)))
        app_log_dir = os.path.join(log_root, self.session_name, app_id)
        prepend_cwd = bool(cfg.get("prepend_cwd"))
        path_env = search_path(self._extra_paths)
        opts = cast(LocalOpts, dict(cfg))  # runopts checked the keys and types
        provider = self._image_provider_class(opts)
        req = PopenRequest(
            app_id=app_id,
            log_dir=app_log_dir,
            app=appdef_to_dict(app),
            idempotency_token=app_idempotency_token(app),
            stall_timeout=app_stall_timeout(app),
        )
        progress_file = str(self._app_dir(app_id) / files.PROGRESS)
        for role in app.roles:
            img_root = workspace_dir(role) or provider.fetch_role(role)
            params: List[ReplicaParam] = []
            dirs: List[str] = []
            rdzv_port = rdzv_port_for(role)  # one free port per role, shared by its replicas
            for replica_id in range(role.num_replicas):
                values = macros.Values(
                    img_root=img_root,
                    app_id=app_id,
                    replica_id=str(replica_id),
                    rank0_env=RANK0_ENV,
                    rdzv_port=rdzv_port,
                )
                rdir = os.path.join(app_log_dir, role.name, str(replica_id))
                param = provider.get_replica_param(
                    img_root,
                    values.apply(role),
                    os.path.join(rdir, STDOUT_LOG),
                    os.path.join(rdir, STDERR_LOG),
                    os.path.join(rdir, COMBINED_LOG),
                )
                param.cwd = workspace_dir(role) or param.cwd or os.getcwd()
                param.error_file = os.path.join(rdir, ERROR_FILE)
                param.env.setdefault("PYTHONUNBUFFERED", "1")
                param.env.update(
                    {
                        # the replica's cwd (the image dir) is searched last, as upstream;
                        # first with prepend_cwd
                        "PATH": _join_PATH(param.cwd, path_env)
                        if prepend_cwd
                        else _join_PATH(path_env, param.cwd),
                        RANK0_ENV: "localhost",
                        "TORCHELASTIC_ERROR_FILE": param.error_file,
                        "PET_LOG_DIR": os.path.join(app_log_dir, "torchelastic", role.name),
                        ENV_PROGRESS_FILE: progress_file,
                    }
                )
                if replica_id == 0:
                    check_entrypoint(role.name, param.args[0], path_env, param.cwd)
                params.append(param)
                dirs.append(rdir)
            req.role_params[role.name] = params
            req.role_log_dirs[role.name] = dirs
        self.auto_set_CUDA_VISIBLE_DEVICES(req.role_params, app, opts)
        return AppDryRunInfo(req, _format_request)

    def _cuda_device_count(self) -> int:
        return cuda_device_count()

    def auto_set_CUDA_VISIBLE_DEVICES(
        self, role_params: Dict[str, List[ReplicaParam]], app: AppDef, cfg: LocalOpts
    ) -> None:
        """See ``images.set_cuda_visible_devices`` (upstream's method name)."""
        set_cuda_visible_devices(role_params, app, cfg, self._cuda_device_count)

    def schedule(self, dryrun_info: AppDryRunInfo[PopenRequest]) -> str:
        req = dryrun_info.request
        root = self._state_root()
        files.makedirs_private(str(root))
        app_dir = root / req.app_id
        os.mkdir(app_dir, files.DIR_MODE)  # FileExistsError: never reuse an app's directory
        os.chmod(app_dir, files.DIR_MODE)
        roles = {
            r["name"]: RoleSpec(
                max_retries=r["max_retries"],
                retry_policy=r["retry_policy"],
                min_replicas=r["num_replicas"] if r["min_replicas"] is None else r["min_replicas"],
            )
            for r in req.app["roles"]
        }
        replicas = [
            ReplicaSpec(
                role=role,
                replica_id=i,
                args=p.args,
                env=p.env,
                cwd=p.cwd or os.getcwd(),
                stdout=p.stdout or "",
                stderr=p.stderr or "",
                combined=p.combined or "",
                error_file=p.error_file,
            )
            for role, params in req.role_params.items()
            for i, p in enumerate(params)
        ]
        for rdirs in req.role_log_dirs.values():
            for d in rdirs:
                files.makedirs_private(d)
        request = Request(
            app_id=req.app_id,
            log_dir=req.log_dir,
            app=req.app,
            roles=roles,
            replicas=replicas,
            idempotency_token=req.idempotency_token,
            stall_timeout=req.stall_timeout,
            submitted=time.time(),
        )
        files.write_atomic(str(app_dir / files.REQUEST), json.dumps(request))
        if req.idempotency_token:
            token_dir = root / TOKENS_DIR / req.idempotency_token
            files.makedirs_private(str(token_dir))
            os.close(files.open_private(str(token_dir / req.app_id)))
        log_fd = files.open_private(str(app_dir / files.SUPERVISOR_LOG))
        from torchx.schedulers.local import launch

        try:
            proc = launch.start(str(app_dir), log_fd)
        finally:
            os.close(log_fd)
        self._wait_started(app_dir, proc)
        return req.app_id

    def _wait_started(self, app_dir: Path, proc: Started) -> None:
        """Return once the supervisor has started the replicas (or the app already ended,
        e.g. cancelled while it was being launched)."""
        state = app_dir / files.STATE
        deadline = time.monotonic() + files.LAUNCH_TIMEOUT
        while not state.exists():
            if proc.poll() is not None and not state.exists():
                out = files.read_private(str(app_dir / files.SUPERVISOR_LOG))
                text = out.decode(errors="replace").strip()
                msg = f"the local supervisor exited with {proc.returncode}: {text[-500:]}"
                files.finalize(str(app_dir), files.FAILED, msg)
                raise RuntimeError(msg)
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"local_cwd supervisor did not start within {files.LAUNCH_TIMEOUT:.0f} s"
                    f" (see {app_dir})"
                )
            time.sleep(0.002)

    def _request(self, app_id: str, root: Optional[Path] = None) -> Optional[Request]:
        """The app's request; None if there is no such app. Raises ``UnreadableAppError``.
        ``root``: the state root, when the caller has it (``list`` reads a thousand apps)."""
        if not app_id or "/" in app_id or app_id.startswith("."):
            return None
        app_dir = (root or self._state_root()) / app_id
        key = _stat_key(app_dir / files.REQUEST)
        cached = self._requests.get(app_id)
        if key is not None and cached is not None and cached[0] == key:
            return cached[1]
        try:
            request = files.load_request(str(app_dir))
        except BadRecord as e:
            raise UnreadableAppError(app_id, e.path, e.reason) from None
        if key is not None and request is not None:
            self._requests[app_id] = (key, request)
        return request

    def _observe(self, app_id: str, root: Optional[Path] = None) -> Optional[Tuple[Request, State]]:
        """The app's request and its state as ``control.observed_state`` sees it (reads
        only); None if there is no such app. Raises ``UnreadableAppError``."""
        root = root or self._state_root()
        request = self._request(app_id, root)
        if request is None:
            return None
        from torchx.schedulers.local import control

        try:
            return request, control.observed_state(str(root / app_id), request)
        except BadRecord as e:
            raise UnreadableAppError(app_id, e.path, e.reason) from None

    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        root = self._state_root()  # checked once per call (``torchx.util.paths.state_dir``)
        found = self._observe(app_id, root)
        if found is None:
            return None
        request, doc = found
        app_dir = root / app_id
        state = AppState[doc["state"]]
        from torchx.specs.serialize import appdef_from_dict

        try:
            app = appdef_from_dict(request["app"])
        except (KeyError, TypeError, ValueError) as e:
            raise UnreadableAppError(app_id, str(app_dir / files.REQUEST), repr(e)) from None
        replica_states = {(r["role"], r["id"]): r["state"] for r in doc.get("replicas", [])}
        roles_statuses: List[RoleStatus] = []
        error_files: List[tuple[float, str]] = []
        for role in app.roles:
            replicas: List[ReplicaStatus] = []
            for i in range(role.num_replicas):
                rstate = AppState[replica_states.get((role.name, i), files.PENDING)]
                if state == AppState.CANCELLED and rstate.name not in files.TERMINAL:
                    rstate = AppState.CANCELLED
                err_path = os.path.join(request["log_dir"], role.name, str(i), ERROR_FILE)
                structured = NONE
                if rstate == AppState.FAILED and os.path.isfile(err_path):
                    with contextlib.suppress(OSError):
                        structured = files.read_private(err_path).decode(errors="replace")
                        error_files.append((os.path.getmtime(err_path), structured))
                replicas.append(ReplicaStatus(i, rstate, role.name, "localhost", structured))
            roles_statuses.append(RoleStatus(role.name, replicas))
        structured_error = min(error_files)[1] if error_files and state == AppState.FAILED else NONE
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            num_restarts=int(doc.get("num_restarts", 0)),
            msg=doc.get("msg") or NONE,
            structured_error_msg=structured_error,
            ui_url=f"file://{request['log_dir']}",
            metadata=dict(app.metadata),
            roles_statuses=roles_statuses,
            roles=app.roles,
        )

    def progress_path(self, app_id: str) -> Optional[str]:
        """``progress.json`` in the app's directory (see ``torchx.runtime.progress``)."""
        if self._request(app_id) is None:
            return None
        return str(self._app_dir(app_id) / files.PROGRESS)

    def _summary(
        self, app_id: str, root: Optional[Path] = None
    ) -> Optional[tuple[float, ListAppResponse]]:
        """``(submitted, ListAppResponse)``; None (with a warning) if it is unreadable."""
        try:
            found = self._observe(app_id, root)
            if found is None:
                return None
            request, doc = found
        except UnreadableAppError as e:
            log.warning("skipping %s", e)
            return None
        state = AppState[doc["state"]]
        return request["submitted"], ListAppResponse(app_id, state, name=request["app"]["name"])

    def list(self) -> List[ListAppResponse]:
        """Every app of this session, newest first (unreadable ones skipped with a warning)."""
        root = self._state_root()
        try:
            with os.scandir(root) as entries:  # the entries' types without a stat each
                app_ids = [d.name for d in entries if not d.name.startswith(".") and d.is_dir()]
        except (FileNotFoundError, NotADirectoryError):
            return []
        return self._summaries(app_ids, newest_first=True, root=root)

    def find_by_idempotency_token(
        self, token: str, cfg: Optional[Mapping[str, CfgVal]] = None
    ) -> List[ListAppResponse]:
        """Apps submitted with ``token``, oldest first (app id breaking ties). Reads an index
        of the token's apps, so its cost does not grow with the number of other apps."""
        token_dir = self._state_root() / TOKENS_DIR / token
        if not token or "/" in token or not token_dir.is_dir():
            return []
        return self._summaries(os.listdir(token_dir), newest_first=False)

    def _summaries(
        self, app_ids: List[str], newest_first: bool, root: Optional[Path] = None
    ) -> List[ListAppResponse]:
        """The readable apps of ``app_ids``, by submission time (app id breaking ties)."""
        root = root or self._state_root()
        found = [s for s in (self._summary(app_id, root) for app_id in app_ids) if s is not None]
        found.sort(key=lambda x: (x[0], x[1].app_id), reverse=newest_first)
        return [app for _, app in found]

    def schedule_keyed(
        self, token: str, dryrun_info: AppDryRunInfo[PopenRequest], reattach_succeeded: bool
    ) -> tuple[str, Optional[str]]:
        """An atomic claim file per token (``claims``): of racing submitters one launches,
        the others get its app; a failed launch gives its claim up."""
        from torchx.schedulers.local import claims

        if not token or "/" in token or token.startswith("."):
            raise InvalidAppError(f"idempotency token {token!r} is not a plain name")
        token_dir = str(self._state_root() / TOKENS_DIR / token)
        app_id = dryrun_info.request.app_id
        holder = claims.claim(token_dir, app_id, self._app_state, reattach_succeeded)
        if holder is not None:
            return holder, None
        try:
            return app_id, self.schedule(dryrun_info)
        except BaseException:  # nothing launched (an interrupt too): free the key, re-raise
            claims.release(token_dir, app_id, self._app_state)
            raise

    def _app_state(self, app_id: str) -> Optional[str]:
        found = self._summary(app_id)
        return None if found is None else found[1].state.name

    def wait_for_change(self, app_id: str, timeout: float) -> None:
        """Return once ``state.json`` changes, or the supervisor is seen gone (its end
        is not written by readers), or after ``timeout`` s."""
        from torchx.schedulers.local import control

        app_dir = self._app_dir(app_id)
        path = app_dir / files.STATE
        before = _stat_key(path)
        deadline = time.monotonic() + timeout
        checks = 0
        while time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
            if _stat_key(path) != before:
                return
            checks += 1
            if checks % 20 == 0 and control.supervisor_alive(str(app_dir)) is False:
                return

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
    ) -> LogLines:
        """The replica's log lines (a ``LogLines``: also ``blocks()`` of many lines)."""
        from torchx.schedulers.local import control
        from torchx.schedulers.local.logs import LogLines, follow_chunks, read_chunks

        request = self._request(app_id)
        if request is None:
            raise ValueError(f"unknown local_cwd app {app_id}")
        roles = {r["name"]: r for r in request["app"]["roles"]}
        if role_name not in roles:
            raise ValueError(f"app {app_id} has no role {role_name!r}; roles: {', '.join(roles)}")
        if not 0 <= k < roles[role_name]["num_replicas"]:
            raise ValueError(f"role {role_name!r} of app {app_id} has no replica {k}")
        stream = (streams or Stream.COMBINED).value
        path = os.path.join(request["log_dir"], role_name, str(k), f"{stream}.log")
        if not should_tail:
            return LogLines(read_chunks(path), regex)
        app_dir = self._app_dir(app_id)

        def finished() -> bool:
            return control.observed_state(str(app_dir), request)["state"] in files.TERMINAL

        return LogLines(follow_chunks(path, finished), regex)

    def _cancel_existing(self, app_id: str) -> None:
        """Cancel and return once the app is terminal (see ``control.cancel``)."""
        from torchx.schedulers.local import control

        request = self._request(app_id)
        if request is not None:
            control.cancel(str(self._app_dir(app_id)), request)


def _stat_key(path: Path) -> Optional[tuple[int, int]]:
    try:
        st = path.stat()
        return (st.st_ino, st.st_mtime_ns)
    except OSError:
        return None


def create_scheduler(
    session_name: str,
    cache_size: int = 100,
    extra_paths: Optional[List[str]] = None,
    image_provider_class: Callable[[LocalOpts], ImageProvider] = CWDImageProvider,
    torchx_home: Optional[str] = None,
    **kwargs: Any,
) -> LocalScheduler:
    return LocalScheduler(session_name, image_provider_class, cache_size, extra_paths, torchx_home)
