"""``slurm``: an AppDef becomes one heterogeneous ``sbatch`` job, one het group per replica.

The batch script (``batch``) runs one ``srun`` over all groups, each writing
``slurm-<jobid>-<role>-<replica>.{out,err}`` in the job directory; ``max_retries`` requeues.
Status comes from ``status``. The owner and idempotency token ride in the job comment. A
keyed job is submitted held and released only once it is the oldest live job of its token,
so of racing submitters only one job starts its command.

The app (roles, for ``describe`` and ``log``) is recorded 0600 under ``$TORCHX_HOME/slurm``
and as ``slurm-<jobid>.torchx.json`` in the job directory, where another machine that
re-attaches finds it. A stall's reason (``torchx.runtime.watchdog``) is the last line of
the replica's ``.err``.

The job directory is ``job_dir`` if given (the job also runs there), else a new private one
under ``$TORCHX_HOME/slurm/jobs`` while the job runs in the submitter's working directory:
torchx writes nothing into a directory the user did not name. Besides the logs it holds the
batch script and the replicas' env files (0600), so no secret is on a command line.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional

from torchx.runtime.progress import ENV_PROGRESS_FILE
from torchx.runtime.watchdog import stall_reason_in
from torchx.schedulers.api import (
    OWNER,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    app_idempotency_token,
    app_stall_timeout,
    filter_regex,
)
from torchx.schedulers.ids import make_unique
from torchx.schedulers.slurm.batch import (
    PROGRESS_FILE,
    RANK0_ENV,
    SBATCH_JOB_OPTIONS,
    SlurmBatchRequest,
    SlurmReplicaRequest,
    comment_metadata,
    token_of,
    with_token,
)
from torchx.schedulers.slurm.status import (
    SLURM_STATES,
    SQUEUE_LIST_FIELDS,
    SlurmError,
    query_job,
    run,
    squeue_groups,
)
from torchx.specs import (
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
from torchx.util.paths import torchx_home, write_private
from torchx.workspace.dir_workspace import DirWorkspaceMixin

# how far back finished jobs are searched (sacct -S) by ``list`` and by idempotency tokens
SACCT_SINCE = "now-7days"


def _app_state(parts: List[Dict[str, Any]]) -> AppState:
    """A het job ends as one; while any group is not done, the job is not either."""
    states = [SLURM_STATES.get(p["state"], AppState.UNKNOWN) for p in parts]
    live = [s for s in states if not is_terminal(s)]
    if not live:
        return states[0]
    return AppState.RUNNING if AppState.RUNNING in live else live[0]


def _replica_state(part: Dict[str, Any]) -> AppState:
    """A finished group's own outcome: its exit code, not the job's (which the first
    failing group decides for all)."""
    state = SLURM_STATES.get(part["state"], AppState.UNKNOWN)
    if is_terminal(state) and state != AppState.CANCELLED and part["exit_code"] is not None:
        return AppState.FAILED if part["exit_code"] else AppState.SUCCEEDED
    return state


# sacct's codes of the states a job ends in
ENDED_STATES = "CA,CD,F,TO,NF,OOM,PR,DL,BF"
# the reason squeue gives a job submitted with ``sbatch --hold`` (by its user or root)
HELD_REASON = "JobHeldUser"


def _user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


class SlurmScheduler(DirWorkspaceMixin, Scheduler[SlurmBatchRequest]):
    def __init__(self, session_name: str, torchx_home: Optional[str] = None) -> None:
        super().__init__("slurm", session_name)
        self._torchx_home = torchx_home  # None: $TORCHX_HOME
        # app names by job id, from the records (written once): a poller's list of N jobs
        # reads each record once, not every round
        self._app_names: Dict[str, str] = {}

    def _run_opts(self) -> runopts:
        opts = runopts()
        for key, help_text in (
            ("partition", "partition to run on (default: the cluster's default)"),
            ("time", "time limit, e.g. 1:00:00"),
            ("comment", "job comment"),
            ("constraint", "node features required"),
            ("mail-user", "where to send job mail"),
            ("mail-type", "which events to mail (e.g. END,FAIL)"),
            (
                "job_dir",
                "directory the job runs in and writes its logs to (default: it runs in cwd,"
                " logs go to a new directory under $TORCHX_HOME/slurm/jobs)",
            ),
            (
                "account",
                "account to charge the job to (sbatch --account; default: the user's default)",
            ),
            ("qos", "quality of service (sbatch --qos; default: the association's default)"),
        ):
            opts.add(key, type_=str, help=help_text)
        opts.add("exclusive", type_=bool, default=False, help="whole nodes per replica")
        return opts

    def _submit_dryrun(
        self, app: AppDef, cfg: Mapping[str, CfgVal]
    ) -> AppDryRunInfo[SlurmBatchRequest]:
        from torchx.specs.serialize import appdef_to_dict

        replicas: Dict[str, SlurmReplicaRequest] = {}
        # absolute now: the progress file's path is in the replicas' env
        given = cfg.get("job_dir")
        work_dir = os.path.abspath(str(given) if given else os.getcwd())
        job_dir = work_dir if given else self._new_job_dir(app.name)
        progress = os.path.join(job_dir, PROGRESS_FILE.format(job_id=macros.app_id))
        for role in app.roles:
            for i in range(role.num_replicas):
                values = macros.Values(
                    img_root=role.image,
                    app_id=macros.app_id,
                    replica_id=str(i),
                    rank0_env=RANK0_ENV,
                )
                replica_role = values.apply(role)
                replica_role.env.setdefault("TORCHX_REPLICA_ID", str(i))
                replica_role.env.setdefault(ENV_PROGRESS_FILE, progress)
                name = f"{role.name}-{i}"
                replicas[name] = SlurmReplicaRequest.from_role(
                    name, replica_role, cfg, stall_timeout=app_stall_timeout(app), job_dir=job_dir
                )
        comment = with_token(
            str(cfg["comment"]) if cfg.get("comment") else None,
            app_idempotency_token(app),
            app.metadata.get(OWNER),
        )
        # the batch step's own output (Slurm's default: the working dir) goes beside the logs
        out = os.path.join(job_dir, "slurm-%j.out")
        cmd = ["sbatch", "--parsable", f"--chdir={work_dir}", f"--output={out}"]
        if app_idempotency_token(app):
            cmd.append("--hold")  # released by find_by_idempotency_token once it won its key
        for key in sorted(SBATCH_JOB_OPTIONS):
            value = comment if key == "comment" else cfg.get(key)
            if value:
                cmd.append(f"--{key}={value}")
        req = SlurmBatchRequest(
            cmd,
            replicas,
            job_dir,
            min((r.max_retries for r in app.roles), default=0),
            appdef_to_dict(app),
        )
        return AppDryRunInfo(req, repr)

    def _new_job_dir(self, app_name: str) -> str:
        """A fresh job directory's path under ``$TORCHX_HOME/slurm/jobs`` (made on submit)."""
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", app_name)[:40] or "app"
        return str(torchx_home(self._torchx_home) / "slurm" / "jobs" / make_unique(name))

    def schedule(self, dryrun_info: AppDryRunInfo[SlurmBatchRequest]) -> str:
        req = dryrun_info.request
        job_dir = os.path.abspath(req.job_dir or os.getcwd())
        req.job_dir = job_dir
        script = req.write()  # the env files and the script, each new and 0600
        out = run([*req.cmd, script], cwd=job_dir)
        job_id = out.strip().split(";")[0]
        record = json.dumps({"job_dir": job_dir, "app": req.app, "replicas": list(req.replicas)})
        write_private(self._record_path(job_id), record)
        write_private(Path(job_dir) / f"slurm-{job_id}.torchx.json", record)
        return job_id

    def progress_path(self, app_id: str) -> Optional[str]:
        """``slurm-<jobid>.progress.json`` in the job's directory (its env names it)."""
        job_dir = self._job_dir(app_id)
        return os.path.join(job_dir, PROGRESS_FILE.format(job_id=app_id)) if job_dir else None

    def _record_path(self, job_id: str) -> Path:
        return torchx_home(self._torchx_home) / "slurm" / f"{job_id}.json"

    def _record(self, job_id: str, work_dir: str = "") -> Optional[Dict[str, Any]]:
        """The app as submitted: this machine's record, else the one in the job directory."""
        paths = [self._record_path(job_id)]
        if work_dir:
            paths.append(Path(work_dir) / f"slurm-{job_id}.torchx.json")
        for path in paths:
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(record, dict) and "app" in record and "job_dir" in record:
                return record
        return None

    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        if not app_id.isdigit():
            return None
        parts = query_job(app_id)
        if not parts:
            return None
        from torchx.specs.serialize import appdef_from_dict

        record = self._record(app_id, parts[0]["work_dir"])
        app = appdef_from_dict(record["app"]) if record else None
        state = _app_state(parts)
        by_name = {p["name"]: p for p in parts}
        missing = {"exit_code": None, "node": "", "state": "UNKNOWN"}
        # without the app (a job torchx did not submit), roles come from the group names
        names = (
            [(r.name, r.num_replicas) for r in app.roles]
            if app
            else _roles_from_names([p["name"] for p in parts])
        )
        job_dir = record["job_dir"] if record else parts[0]["work_dir"]
        roles: List[RoleStatus] = []
        failing: List[str] = []
        errs: List[str] = []  # the failed replicas' stderr files
        for role_name, count in names:
            reps = []
            for i in range(count):
                p = by_name.get(f"{role_name}-{i}", missing)
                s = _replica_state(p)
                if s == AppState.FAILED:
                    failing.append(f"{role_name}/{i} (exit {p['exit_code']})")
                    errs.append(os.path.join(job_dir, f"slurm-{app_id}-{role_name}-{i}.err"))
                reps.append(ReplicaStatus(i, s, role_name, p["node"]))
            roles.append(RoleStatus(role_name, reps))
        failed = failing and state == AppState.FAILED
        msg = f"failed replicas: {', '.join(failing)}" if failed else ""
        structured = NONE
        if errs and job_dir:
            structured = _last_error(_text(errs[0]))
            # a replica's watchdog stopped it (its peers then failed too: kill-on-bad-exit)
            msg = next(filter(None, (stall_reason_in(_text(e, tail=4096)) for e in errs)), msg)
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            num_restarts=parts[0]["restarts"],
            msg=msg or NONE,
            structured_error_msg=structured,
            roles_statuses=roles,
            roles=app.roles if app else [],
            ui_url=f"file://{job_dir}" if job_dir else None,
            # the record's (e.g. the stall timeout, for waiters), then the job comment's
            metadata={
                **{k: v for k, v in (app.metadata if app else {}).items() if v},
                **comment_metadata(parts[0]["comment"]),
            },
        )

    def list(self) -> List[ListAppResponse]:
        """Jobs slurmctld holds (cluster-wide ``squeue``) and jobs that ended within
        ``SACCT_SINCE`` (``sacct``, where accounting exists)."""
        seen: Dict[str, ListAppResponse] = {}
        out = run(["squeue", "-h", "-t", "all", "-O", SQUEUE_LIST_FIELDS])
        for app_id, group in squeue_groups(out, SQUEUE_LIST_FIELDS):
            if app_id not in seen:
                state = SLURM_STATES.get(group["state"], AppState.UNKNOWN)
                seen[app_id] = self._listed(app_id, state, group["name"])
        for app_id, state, name, _ in _ended_leaders([]):
            if app_id not in seen:
                seen[app_id] = self._listed(app_id, state, name)
        return sorted(seen.values(), key=lambda a: int(a.app_id), reverse=True)

    def _listed(self, app_id: str, state: AppState, job_name: str) -> ListAppResponse:
        if app_id not in self._app_names:
            record = self._record(app_id)
            if record is None:  # another user's job, or not recorded yet
                return ListAppResponse(app_id, state, name=job_name)
            self._app_names[app_id] = record["app"]["name"]
        return ListAppResponse(app_id, state, name=self._app_names[app_id])

    def find_by_idempotency_token(
        self, token: str, cfg: Optional[Mapping[str, CfgVal]] = None
    ) -> List[ListAppResponse]:
        """This user's jobs whose comment carries ``token``, oldest (lowest id) first.
        Keyed jobs are submitted held: this releases the oldest live one (every racer and
        every retry calls it, so a winner whose submitter died is released too)."""
        found: Dict[str, ListAppResponse] = {}
        held = set()
        fields = SQUEUE_LIST_FIELDS + ",Reason:|,Comment:"
        out = run(["squeue", "-h", "-t", "all", "-u", _user(), "-O", fields])
        for app_id, group in squeue_groups(out, fields):
            if group["offset"] != 0 or token_of(group["comment"]) != token:
                continue  # another het group's line, or another stage's job
            state = SLURM_STATES.get(group["state"], AppState.UNKNOWN)
            found[app_id] = self._listed(app_id, state, group["name"])
            if group["state"] == "PENDING" and group["reason"] == HELD_REASON:
                held.add(app_id)
        for app_id, state, job_name, job_comment in _ended_leaders(["-u", _user()]):
            if app_id not in found and token_of(job_comment) == token:
                found[app_id] = self._listed(app_id, state, job_name)
        apps = sorted(found.values(), key=lambda a: (int(a.app_id), a.app_id))
        live = [a.app_id for a in apps if not is_terminal(a.state)]
        if live and live[0] in held:
            run(["scontrol", "release", live[0]])
        return apps

    def _cancel_existing(self, app_id: str) -> None:
        run(["scancel", app_id])

    def _job_dir(self, app_id: str) -> Optional[str]:
        """From this machine's record, else (submitted elsewhere) the job's working
        directory's; None if neither knows the job."""
        if not app_id.isdigit():
            return None
        record = self._record(app_id)
        if record:
            return str(record["job_dir"])
        parts = query_job(app_id)
        if not parts or not parts[0]["work_dir"]:
            return None
        record = self._record(app_id, parts[0]["work_dir"])
        return str(record["job_dir"]) if record else str(parts[0]["work_dir"])

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
        job_dir = self._job_dir(app_id)
        if job_dir is None:
            raise ValueError(f"slurm knows no job {app_id} and this machine has no record of it")
        base = os.path.join(job_dir, f"slurm-{app_id}-{role_name}-{k}")
        # Slurm keeps the streams apart; "combined" (the default) reads both
        exts = {Stream.STDOUT: ["out"], Stream.STDERR: ["err"]}.get(
            streams or Stream.COMBINED, ["out", "err"]
        )
        paths = [f"{base}.{ext}" for ext in exts]
        lines = (
            self._follow(app_id, paths)
            if should_tail
            else (line for p in paths for line in _read(p))
        )
        return filter_regex(regex, lines)

    def _follow(self, app_id: str, paths: List[str]) -> Iterator[str]:
        pos, partial = dict.fromkeys(paths, 0), dict.fromkeys(paths, b"")
        while True:
            desc = self.describe(app_id)
            done = desc is None or is_terminal(desc.state)
            for path in paths:
                if not os.path.exists(path):
                    continue
                with open(path, "rb") as f:
                    f.seek(pos[path])
                    chunk = f.read()
                pos[path] += len(chunk)
                *lines, partial[path] = (partial[path] + chunk).split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace") + "\n"
            if done:  # each file's last line, if it has no newline
                yield from (rest.decode(errors="replace") for rest in partial.values() if rest)
                return
            time.sleep(0.5)


def _roles_from_names(names: List[str]) -> List[tuple[str, int]]:
    """``[(role, replicas)]`` from group names ``<role>-<i>``, in first-seen order."""
    counts: Dict[str, int] = {}
    for name in names:
        role, _, i = name.rpartition("-")
        if role and i.isdigit():
            counts[role] = max(counts.get(role, 0), int(i) + 1)
    return list(counts.items())


def _ended_leaders(args: List[str]) -> Iterator[tuple[str, AppState, str, str]]:
    """``(app_id, state, job name, comment)`` of the first group of each job that ended since
    ``SACCT_SINCE`` (``sacct -X``, with ``args``); nothing where the cluster keeps no
    accounting. By state: without -s, sacct skips jobs that were never eligible (held jobs
    cancelled, e.g. a losing keyed submission), which slurmctld forgets after MinJobAge."""
    fields = ["-E", "now", "-s", ENDED_STATES, "-o", "JobID,State,JobName,Comment"]
    try:
        out = run(["sacct", "-X", "-P", "-n", "-S", SACCT_SINCE, *fields, *args])
    except SlurmError:
        return
    for line in out.splitlines():
        cols = line.split("|", 3)
        m = re.fullmatch(r"(\d+)(?:\+(\d+))?", cols[0])
        if len(cols) < 4 or not m or int(m.group(2) or 0) != 0:
            continue
        state = cols[1].split()[0] if cols[1].strip() else "UNKNOWN"
        yield m.group(1), SLURM_STATES.get(state, AppState.UNKNOWN), cols[2], cols[3]


def _read(path: str) -> Iterator[str]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return
    for line in data.splitlines(keepends=True):
        yield line.decode(errors="replace")


def _text(path: str, tail: int = 0) -> str:
    """A replica's log, decoded (only its last ``tail`` bytes if given); "" if unreadable."""
    with contextlib.suppress(OSError), open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - tail) if tail else 0)
        return f.read().decode(errors="replace")
    return ""


def _last_error(text: str) -> str:
    """The last exception-looking line of a replica's stderr (Slurm has no reply files)."""
    for ln in map(str.strip, reversed(text.splitlines())):
        if re.search(r"(Error|Exception)\b", ln) and not ln.startswith(("srun:", "slurmstepd:")):
            return re.sub(r"^\[\d+\]:(\[rank\d+\]:)?\s*", "", ln)
    return NONE


def create_scheduler(
    session_name: str, torchx_home: Optional[str] = None, **kwargs: Any
) -> SlurmScheduler:
    return SlurmScheduler(session_name, torchx_home)
