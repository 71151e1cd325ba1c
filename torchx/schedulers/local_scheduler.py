"""``local_cwd``: run each replica as a local process, in the current directory.

Unlike upstream TorchX, an app's state lives on disk, so any process can see it:

- ``schedule`` writes ``request.json`` into the app's directory under
  ``$TORCHX_HOME/local_cwd/<session>/<app_id>/`` and starts a small detached
  supervisor (``local_supervisor.py``) in its own session. The supervisor starts
  the replicas (each in its own process group), copies their stdout/stderr to
  ``{log_dir}/{session}/{app_id}/{role}/{replica}/{stdout,stderr,combined}.log``,
  applies retries, and writes ``state.json`` atomically on every change.
- ``describe``/``list``/``log_iter``/``cancel`` only read those files (and signal
  the supervisor), so ``torchx status``/``log``/``list``/``cancel`` work from any
  shell, while the job runs and after it ended.
- If the launching process dies (even SIGKILL), the job keeps running under its
  supervisor and stays inspectable and cancellable. If the supervisor itself is
  killed, ``describe`` notices (pid + start time), and ``cancel`` kills the
  replicas' process trees from the recorded pids.
- ``wait_for_change`` watches ``state.json``, so ``Runner.wait`` returns within a
  few tens of milliseconds of the app ending.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional

from torchx.schedulers.api import (
    DescribeAppResponse,
    InvalidAppError,
    ListAppResponse,
    Scheduler,
    Stream,
    filter_regex,
)
from torchx.schedulers.ids import unique_name
from torchx.specs.api import (
    NONE,
    AppDef,
    AppDryRunInfo,
    AppState,
    CfgVal,
    ReplicaStatus,
    RoleStatus,
    is_terminal,
    macros,
    runopts,
)
from torchx.util.paths import torchx_home

SUPERVISOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "local_supervisor.py")
RANK0_ENV = "TORCHX_RANK0_HOST"
POLL_SECONDS = 0.01


@dataclass
class ReplicaParam:
    """How one replica is started: command, added env, log files, cwd."""

    args: List[str]
    env: Dict[str, str]
    stdout: str
    stderr: str
    combined: str
    cwd: str
    error_file: str = ""


@dataclass
class PopenRequest:
    """What ``local_cwd`` runs for an app: per role, one ``ReplicaParam`` per replica."""

    app_id: str
    log_dir: str
    role_params: Dict[str, List[ReplicaParam]] = field(default_factory=dict)
    role_log_dirs: Dict[str, List[str]] = field(default_factory=dict)
    app: Dict[str, Any] = field(default_factory=dict)


def _format_request(req: PopenRequest) -> str:
    lines = [f"app_id: {req.app_id}", f"log_dir: {req.log_dir}"]
    for role, params in req.role_params.items():
        for i, p in enumerate(params):
            lines.append(f"{role}/{i}:")
            lines.append(f"  cmd: {shlex.join(p.args)}")
            lines.append(f"  cwd: {p.cwd}")
            for k, v in sorted(p.env.items()):
                if k != "PATH":
                    lines.append(f"  env: {k}={v}")
            lines.append(f"  logs: {os.path.dirname(p.combined)}")
    return "\n".join(lines)


def _make_app_id(name: str) -> str:
    return unique_name(name, max_base=40, suffix_length=10)


def _read_json(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class LocalScheduler(Scheduler[PopenRequest]):
    """Runs replicas as local processes; all state on disk (see module doc)."""

    def __init__(
        self, session_name: str, cache_size: int = 100, extra_paths: Optional[List[str]] = None
    ) -> None:
        super().__init__("local_cwd", session_name)
        self._extra_paths = extra_paths or []

    # ------------------------------------------------------------------ paths

    def _state_root(self) -> Path:
        return torchx_home() / "local_cwd" / self.session_name

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

    def _validate(self, app: AppDef, scheduler: str, cfg: Mapping[str, CfgVal]) -> None:
        """Local runs need no resources; entrypoints must exist (checked at submit, not at run)."""

    # ------------------------------------------------------------------ submit

    def _path_env(self, prepend_cwd: bool) -> str:
        parts = [os.path.dirname(sys.executable)] + self._extra_paths
        if prepend_cwd:
            parts.insert(0, os.getcwd())
        parts.append(os.environ.get("PATH", ""))
        seen: List[str] = []
        for p in os.pathsep.join(parts).split(os.pathsep):
            if p and p not in seen:
                seen.append(p)
        return os.pathsep.join(seen)

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[PopenRequest]:
        from torchx.specs.serialize import appdef_to_dict

        app_id = _make_app_id(app.name)
        log_root = str(cfg.get("log_dir") or (torchx_home() / "local_cwd"))
        app_log_dir = os.path.join(log_root, self.session_name, app_id)
        path_env = self._path_env(bool(cfg.get("prepend_cwd")))
        cwd = os.getcwd()
        gpu_ids = _gpu_ids() if cfg.get("auto_set_cuda_visible_devices") else []
        req = PopenRequest(app_id=app_id, log_dir=app_log_dir, app=appdef_to_dict(app))
        gpu_cursor = 0
        for role in app.roles:
            entry = role.entrypoint
            if shutil.which(entry, path=path_env) is None and not os.path.isfile(
                os.path.join(cwd, entry)
            ):
                raise InvalidAppError(
                    f"role {role.name!r}: entrypoint {entry!r} not found on PATH or in {cwd}"
                )
            params: List[ReplicaParam] = []
            dirs: List[str] = []
            for replica_id in range(role.num_replicas):
                values = macros.Values(
                    img_root=cwd, app_id=app_id, replica_id=str(replica_id), rank0_env=RANK0_ENV
                )
                replica_role = values.apply(role)
                rdir = os.path.join(app_log_dir, role.name, str(replica_id))
                env = dict(replica_role.env)
                env.setdefault("PYTHONUNBUFFERED", "1")
                env.update(
                    {
                        "PATH": path_env,
                        RANK0_ENV: "localhost",
                        "TORCHELASTIC_ERROR_FILE": os.path.join(rdir, "error.json"),
                        "PET_LOG_DIR": os.path.join(app_log_dir, "torchelastic", role.name),
                    }
                )
                if gpu_ids and role.resource.gpu > 0:
                    n = role.resource.gpu
                    if gpu_cursor + n <= len(gpu_ids):
                        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids[gpu_cursor : gpu_cursor + n])
                        gpu_cursor += n
                params.append(
                    ReplicaParam(
                        args=[entry, *replica_role.args],
                        env=env,
                        stdout=os.path.join(rdir, "stdout.log"),
                        stderr=os.path.join(rdir, "stderr.log"),
                        combined=os.path.join(rdir, "combined.log"),
                        cwd=cwd,
                        error_file=os.path.join(rdir, "error.json"),
                    )
                )
                dirs.append(rdir)
            req.role_params[role.name] = params
            req.role_log_dirs[role.name] = dirs
        return AppDryRunInfo(req, _format_request)

    def schedule(self, dryrun_info: AppDryRunInfo[PopenRequest]) -> str:
        req = dryrun_info.request
        app_dir = self._app_dir(req.app_id)
        app_dir.mkdir(parents=True, exist_ok=False)
        roles = {
            r["name"]: {
                "max_retries": r["max_retries"],
                "retry_policy": r["retry_policy"],
                "min_replicas": r["min_replicas"]
                if r["min_replicas"] is not None
                else r["num_replicas"],
            }
            for r in req.app["roles"]
        }
        replicas = [
            {
                "role": role,
                "replica_id": i,
                "args": p.args,
                "env": p.env,
                "cwd": p.cwd,
                "stdout": p.stdout,
                "stderr": p.stderr,
                "combined": p.combined,
                "error_file": p.error_file,
            }
            for role, params in req.role_params.items()
            for i, p in enumerate(params)
        ]
        for rdirs in req.role_log_dirs.values():
            for d in rdirs:
                os.makedirs(d, exist_ok=True)
        request = {
            "app_id": req.app_id,
            "log_dir": req.log_dir,
            "app": req.app,
            "roles": roles,
            "replicas": replicas,
            "submitted": time.time(),
        }
        with open(app_dir / "request.json", "w") as f:
            json.dump(request, f)
        with open(app_dir / "supervisor.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, SUPERVISOR, str(app_dir)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                close_fds=True,
            )
        with open(app_dir / "supervisor.pid", "w") as f:
            f.write(f"{proc.pid} {_create_time(proc.pid)}")
        self._wait_started(app_dir, proc)
        return req.app_id

    def _wait_started(self, app_dir: Path, proc: subprocess.Popen[bytes]) -> None:
        """Return once the supervisor has started the replicas (it then handles SIGTERM)."""
        state = app_dir / "state.json"
        deadline = time.monotonic() + 60
        while not state.exists():
            if proc.poll() is not None:
                log = (app_dir / "supervisor.log").read_text(errors="replace").strip()
                raise RuntimeError(
                    f"local_cwd supervisor exited with {proc.returncode}: {log[-500:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"local_cwd supervisor did not start within 60 s (see {app_dir})"
                )
            time.sleep(0.002)

    # ------------------------------------------------------------------ inspect

    def _supervisor_alive(self, app_dir: Path) -> bool:
        try:
            pid_s, ctime_s = (app_dir / "supervisor.pid").read_text().split()
        except (OSError, ValueError):
            return False
        return _create_time(int(pid_s)) == ctime_s and _pid_alive(int(pid_s))

    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        app_dir = self._app_dir(app_id)
        request = _read_json(str(app_dir / "request.json"))
        if request is None:
            return None
        state_doc = _read_json(str(app_dir / "state.json")) or {}
        state = AppState[state_doc.get("state", "PENDING")]
        msg = state_doc.get("msg") or ""
        replica_states = {(r["role"], r["id"]): r for r in state_doc.get("replicas", [])}
        if not is_terminal(state) and not self._supervisor_alive(app_dir):
            # re-read: the supervisor may have finished between the two reads
            state_doc = _read_json(str(app_dir / "state.json")) or {}
            state = AppState[state_doc.get("state", "PENDING")]
            if not is_terminal(state):
                alive = [
                    r
                    for r in state_doc.get("replicas", [])
                    if r.get("pid") and _pid_alive(r["pid"])
                ]
                state = AppState.RUNNING if alive else AppState.FAILED
                msg = "the local supervisor process died" + (
                    "; replicas still running" if alive else ""
                )
        from torchx.specs.serialize import appdef_from_dict

        app = appdef_from_dict(request["app"])
        roles_statuses: List[RoleStatus] = []
        error_files: List[tuple[float, str]] = []
        for role in app.roles:
            replicas: List[ReplicaStatus] = []
            for i in range(role.num_replicas):
                rs = replica_states.get((role.name, i), {})
                rstate = AppState[rs.get("state", "PENDING")]
                if state == AppState.CANCELLED and not is_terminal(rstate):
                    rstate = AppState.CANCELLED
                err_path = os.path.join(request["log_dir"], role.name, str(i), "error.json")
                structured = NONE
                if rstate == AppState.FAILED and os.path.isfile(err_path):
                    try:
                        structured = Path(err_path).read_text()
                        error_files.append((os.path.getmtime(err_path), structured))
                    except OSError:
                        pass
                replicas.append(ReplicaStatus(i, rstate, role.name, "localhost", structured))
            roles_statuses.append(RoleStatus(role.name, replicas))
        structured_error = min(error_files)[1] if error_files and state == AppState.FAILED else NONE
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            num_restarts=int(state_doc.get("num_restarts", 0)),
            msg=msg or NONE,
            structured_error_msg=structured_error,
            ui_url=f"file://{request['log_dir']}",
            metadata=dict(app.metadata),
            roles_statuses=roles_statuses,
            roles=app.roles,
        )

    def list(self) -> List[ListAppResponse]:
        root = self._state_root()
        if not root.is_dir():
            return []
        apps: List[tuple[float, ListAppResponse]] = []
        for app_dir in root.iterdir():
            request = _read_json(str(app_dir / "request.json"))
            if request is None:
                continue
            desc = self.describe(app_dir.name)
            if desc is None:
                continue
            apps.append(
                (
                    request.get("submitted", 0.0),
                    ListAppResponse(
                        app_id=app_dir.name, state=desc.state, name=request["app"]["name"]
                    ),
                )
            )
        return [a for _, a in sorted(apps, key=lambda x: x[0], reverse=True)]

    def wait_for_change(self, app_id: str, timeout: float) -> None:
        """Return once ``state.json`` changes (or after ``timeout`` s)."""
        path = self._app_dir(app_id) / "state.json"
        before = _stat_key(path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
            if _stat_key(path) != before:
                return

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
        request = _read_json(str(self._app_dir(app_id) / "request.json"))
        if request is None:
            raise ValueError(f"unknown local_cwd app {app_id}")
        roles = {r["name"]: r for r in request["app"]["roles"]}
        if role_name not in roles:
            raise ValueError(f"app {app_id} has no role {role_name!r}; roles: {', '.join(roles)}")
        if not 0 <= k < roles[role_name]["num_replicas"]:
            raise ValueError(f"role {role_name!r} of app {app_id} has no replica {k}")
        stream = (streams or Stream.COMBINED).value
        path = os.path.join(request["log_dir"], role_name, str(k), f"{stream}.log")
        lines = self._follow(app_id, path) if should_tail else _read_lines(path)
        return filter_regex(regex, lines)

    def _follow(self, app_id: str, path: str) -> Iterator[str]:
        """Yield lines as they are written; stop at EOF once the app is terminal."""
        state_path = str(self._app_dir(app_id) / "state.json")
        while not os.path.exists(path):
            if self._terminal(app_id, state_path):
                return
            time.sleep(POLL_SECONDS * 5)
        with open(path, "rb") as f:
            partial = b""
            while True:
                chunk = f.read(65536)
                if chunk:
                    partial += chunk
                    *complete, partial = partial.split(b"\n")
                    for line in complete:
                        yield line.decode(errors="replace") + "\n"
                    continue
                if self._terminal(app_id, state_path):
                    partial += f.read()  # written between the last read and the state change
                    *complete, last = partial.split(b"\n")
                    for line in complete:
                        yield line.decode(errors="replace") + "\n"
                    if last:
                        yield last.decode(errors="replace")  # a final line without newline
                    return
                time.sleep(POLL_SECONDS * 2)

    def _terminal(self, app_id: str, state_path: str) -> bool:
        doc = _read_json(state_path)
        if doc is not None and is_terminal(AppState[doc.get("state", "PENDING")]):
            return True
        if doc is None and not self._supervisor_alive(self._app_dir(app_id)):
            return True
        if doc is not None and not self._supervisor_alive(self._app_dir(app_id)):
            desc = self.describe(app_id)
            return desc is None or is_terminal(desc.state)
        return False

    # ------------------------------------------------------------------ cancel

    def _cancel_existing(self, app_id: str) -> None:
        app_dir = self._app_dir(app_id)
        doc = _read_json(str(app_dir / "state.json"))
        if doc is not None and is_terminal(AppState[doc.get("state", "PENDING")]):
            return  # finished apps keep their final state
        if self._supervisor_alive(app_dir):
            pid = int((app_dir / "supervisor.pid").read_text().split()[0])
            os.kill(pid, signal.SIGTERM)
            return
        # no supervisor: kill what it left behind ourselves
        from torchx.schedulers.local_supervisor import kill_tree, write_json_atomic

        doc = _read_json(str(app_dir / "state.json")) or {}
        for r in doc.get("replicas", []):
            if r.get("pid") and _pid_alive(r["pid"]):
                kill_tree(r["pid"], signal.SIGKILL)
        doc.update(
            {"state": "CANCELLED", "msg": "cancelled (supervisor was gone)", "updated": time.time()}
        )
        doc.setdefault("replicas", [])
        write_json_atomic(str(app_dir / "state.json"), doc)


def _read_lines(path: str) -> Iterator[str]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return
    for line in data.splitlines(keepends=True):
        yield line.decode(errors="replace")


def _stat_key(path: Path) -> Optional[tuple[int, int]]:
    try:
        st = path.stat()
        return (st.st_ino, st.st_mtime_ns)
    except OSError:
        return None


def _proc_stat(pid: int) -> Optional[List[str]]:
    """Fields of /proc/<pid>/stat after the command name (state first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _create_time(pid: int) -> Optional[str]:
    """A start-time stamp that tells a pid apart from a later process reusing it."""
    if os.path.isdir("/proc"):  # cheap path (no psutil import on the launch path)
        fields = _proc_stat(pid)
        return fields[19] if fields else None
    try:
        import psutil

        return str(psutil.Process(pid).create_time())
    except Exception:
        return None


def _pid_alive(pid: int) -> bool:
    if os.path.isdir("/proc"):
        fields = _proc_stat(pid)
        return fields is not None and fields[0] != "Z"
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False


def _gpu_ids() -> List[str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU")]


def create_scheduler(
    session_name: str, cache_size: int = 100, extra_paths: Optional[List[str]] = None, **kwargs: Any
) -> LocalScheduler:
    return LocalScheduler(session_name, cache_size, extra_paths)
