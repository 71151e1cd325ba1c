"""``ray``: submit an app through Ray's Job Submission API (a head reached through its
dashboard address, as KubeRay or Anyscale deploy it); the job needs nothing from the
submitter's disk or Python.

- The job's entrypoint is ``python -m torchx.schedulers.ray_driver``, run by the cluster's
  own Python: torchx must be installed on the cluster (``pip install 'torchx[ray]'`` in its
  image). The driver runs one actor per replica (its CPUs and GPUs) in a placement group.
- The request (replicas, their env, the AppDef) travels in the job's ``runtime_env`` env
  vars, which the dashboard hides from browsers but shows to any of its clients.
- The submitter's working directory (less ``.torchxignore``) is uploaded with the job
  (Ray's size limit applies); the run option ``working_dir`` names a directory on the
  cluster instead.
- The app id carries the dashboard it went to, as upstream's does:
  ``ray://<session>/<host:port>-<submission id>``, so a handle works from any shell; an id
  without it (``<submission id>``, older handles) is looked up at ``$RAY_API_SERVER_ADDRESS``
  / ``$RAY_ADDRESS`` / 127.0.0.1:8265. An https dashboard or one under a path cannot be
  written in a handle (no ``/``): its ids carry no address.
- A request that no combination of the cluster's nodes can ever hold is refused at submit
  (a cluster whose autoscaler may add nodes excepted); one that waits for resources shows
  PENDING, with Ray's reason, while its placement group waits.
- Status, logs, ``describe`` (the AppDef, the token and owner included), progress and
  stalls come from the dashboard alone. A keyed submission's id is ``keyed_app_id``: Ray
  refuses it to a racing second submitter, which re-attaches without starting anything.
- With a stall timeout the driver is the job's watchdog: it stops a silent job and leaves
  the reason in the job's log, where ``describe`` reads it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
import time
import urllib.parse
import urllib.request
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional

from torchx.runtime.watchdog import stall_reason_in
from torchx.schedulers.api import (
    IDEMPOTENCY_TOKEN,
    OWNER,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    app_idempotency_token,
    filter_regex,
    keyed_app_id,
    schedule_named,
    stored_app,
)
from torchx.schedulers.ids import unique_name
from torchx.schedulers.ray_driver import (
    ACTOR_PREFIX,
    REQUEST_ENV,
    bundle,
    dashboard_url,
    decode_request,
    encode_request,
    last_progress,
)
from torchx.schedulers.ray_placement import cluster_at, placement_wait, unplaceable
from torchx.specs.api import (
    NONE,
    AppDef,
    AppDryRunInfo,
    AppState,
    CfgVal,
    ReplicaStatus,
    RoleStatus,
    TorchXError,
    is_terminal,
    macros,
    runopts,
)
from torchx.specs.serialize import appdef_from_dict, appdef_to_dict
from torchx.util.modules import import_optional
from torchx.util.paths import torchx_home, write_private
from torchx.workspace.dir_workspace import copy_workspace

META_TORCHX = "torchx"
META_APP_NAME = "app_name"
META_IDEMPOTENCY_TOKEN = "idempotency_token"
META_OWNER = "owner"
DRIVER = "python -m torchx.schedulers.ray_driver"
NO_TORCHX_ON_CLUSTER = (
    "the Ray cluster's Python has no torchx: install torchx on the cluster"
    " (pip install 'torchx[ray]' in its image or runtime environment); the job runs"
    f" `{DRIVER}` with the cluster's own Python"
)
TAIL_LINES = 400  # the log lines read for the last progress record
RAY_STATES = {
    "PENDING": AppState.PENDING,
    "RUNNING": AppState.RUNNING,
    "SUCCEEDED": AppState.SUCCEEDED,
    "FAILED": AppState.FAILED,
    "STOPPED": AppState.CANCELLED,
}


class WorkingDirTooLargeError(TorchXError, ValueError):
    """The working directory to upload is past Ray's package size limit."""


class UnplaceableRequestError(TorchXError, ValueError):
    """No combination of the Ray cluster's nodes can ever hold the request's bundles."""


@dataclass
class RayJob:
    app_id: str
    address: str
    replicas: List[Dict[str, Any]]
    upload_dir: Optional[str]  # the submitter's directory uploaded with the job
    working_dir: Optional[str]  # else: a directory on the cluster
    spread: bool = False
    app: Dict[str, Any] = field(default_factory=dict)
    idempotency_token: Optional[str] = None
    owner: Optional[str] = None

    @property
    def metadata(self) -> Dict[str, str]:
        """Marks the Ray job as torchx's, with its token and owner if any."""
        meta = {META_TORCHX: "1", META_APP_NAME: self.app.get("name", ""), "address": self.address}
        stored = {META_IDEMPOTENCY_TOKEN: self.idempotency_token, META_OWNER: self.owner}
        return {**meta, **{k: v for k, v in stored.items() if v}}

    @property
    def request(self) -> Dict[str, Any]:
        """What the driver reads from the job's runtime_env."""
        return {
            "app_id": self.app_id,
            "replicas": self.replicas,
            "working_dir": self.working_dir or "",
            "spread": self.spread,
            "address": self.address,
            "app": self.app,
        }

    def __repr__(self) -> str:
        where = (
            f"cwd {self.working_dir} on the cluster"
            if self.working_dir
            else f"uploads {self.upload_dir}"
        )
        lines = [f"ray job {self.app_id} on {self.address} ({where}): {DRIVER}"]
        if self.idempotency_token:
            lines.append(f"  idempotency token: {self.idempotency_token}")
        for r in self.replicas:
            gpu = f", {r['gpu']} gpu" if r.get("gpu") else ""
            command = shlex.join(r["args"])
            lines.append(f"  {r['role']}/{r['replica_id']} [{r['cpu']} cpu{gpu}]: {command}")
        return "\n".join(lines)


class RayScheduler(Scheduler[RayJob]):
    names_keyed_apps = True  # Ray refuses a reused submission id: the claim

    def __init__(self, session_name: str) -> None:
        super().__init__("ray", session_name)
        self._clients: Dict[str, Any] = {}  # by dashboard URL: one version check each

    def _run_opts(self) -> runopts:
        opts = runopts()
        opts.add(
            "dashboard_address",
            type_=str,
            default=_env_address(),
            help="Ray dashboard (job submission) address ($RAY_API_SERVER_ADDRESS or $RAY_ADDRESS)",
        )
        opts.add(
            "working_dir",
            type_=str,
            help="a directory on the cluster the replicas run in (default: upload the"
            " current directory with the job, less what .torchxignore excludes)",
        )
        opts.add(
            "spread",
            type_=bool,
            default=False,
            help="place replicas on different nodes when possible",
        )
        return opts

    def _client(self, address: str) -> Any:
        url = dashboard_url(address)
        if url not in self._clients:
            self._clients[url] = self._new_client(url)
        return self._clients[url]

    def _new_client(self, url: str) -> Any:
        js = import_optional("ray.job_submission", "ray")
        from_env = _env_address(default="")
        if not from_env or dashboard_url(from_env) == url:  # the usual case: Ray's own client
            return js.JobSubmissionClient(url)
        # another address (a run option): JobSubmissionClient.__init__ always prefers
        # $RAY_API_SERVER_ADDRESS/$RAY_ADDRESS to its argument (Ray 2.60,
        # ray.dashboard.utils.get_address_for_submission_client); its base class takes an
        # http(s) URL as given. So: the base's init, then the check Ray's init makes.
        from ray.dashboard.modules.dashboard_sdk import SubmissionClient

        client = js.JobSubmissionClient.__new__(js.JobSubmissionClient)
        SubmissionClient.__init__(client, address=url)
        client._check_connection_and_version(min_version="2.0")
        return client

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[RayJob]:
        app_id = keyed_app_id(app) or unique_name(app.name, max_base=40, suffix_length=8)
        working_dir = str(cfg.get("working_dir") or "") or None
        address = str(cfg.get("dashboard_address"))
        handle_id = _app_id(address, app_id)  # ${app_id} as the handle names it
        replicas = []
        for role in app.roles:
            for i in range(role.num_replicas):
                r = macros.Values(
                    img_root=working_dir or ".",
                    app_id=handle_id,
                    replica_id=str(i),
                    rank0_env="TORCHX_RANK0_HOST",
                ).apply(role)
                replicas.append(
                    {
                        "role": role.name,
                        "replica_id": i,
                        "args": [r.entrypoint, *r.args],
                        "env": {"PYTHONUNBUFFERED": "1", **r.env},
                        "cpu": max(r.resource.cpu, 1),
                        "gpu": max(r.resource.gpu, 0),
                        "min_replicas": role.min_replicas or role.num_replicas,
                    }
                )
        job = RayJob(
            app_id,
            address,
            replicas,
            None if working_dir else os.getcwd(),
            working_dir,
            bool(cfg.get("spread")),
            appdef_to_dict(stored_app(app)),
            app_idempotency_token(app),
            app.metadata.get(OWNER) or None,
        )
        return AppDryRunInfo(job, repr)

    def schedule_keyed(
        self, token: str, dryrun_info: AppDryRunInfo[RayJob], reattach_succeeded: bool
    ) -> tuple[str, Optional[str]]:
        """``Scheduler.schedule_keyed``, the keyed id compared as listed (with its address)."""
        job = dryrun_info.request
        if not (dryrun_info.app and keyed_app_id(dryrun_info.app)):
            return super().schedule_keyed(token, dryrun_info, reattach_succeeded)
        app_id = _app_id(job.address, job.app_id)
        taken = self._name_taken
        return schedule_named(self, token, dryrun_info, reattach_succeeded, app_id, taken)

    def schedule(self, dryrun_info: AppDryRunInfo[RayJob]) -> str:
        job = dryrun_info.request
        runtime_env: Dict[str, Any] = {"env_vars": {REQUEST_ENV: encode_request(job.request)}}
        client = self._client(job.address)
        bundles = [bundle(r) for r in job.replicas]
        cluster = cluster_at(dashboard_url(job.address))
        refusal = unplaceable(bundles, cluster, job.address, job.app_id)
        if refusal:
            raise UnplaceableRequestError(refusal)
        with tempfile.TemporaryDirectory(prefix="torchx-ray-upload-") as upload:
            if job.upload_dir:  # the files .torchxignore lets through, uploaded by Ray
                copy_workspace(job.upload_dir, upload)
                runtime_env["working_dir"] = upload
            try:
                client.submit_job(
                    entrypoint=DRIVER,
                    submission_id=job.app_id,
                    entrypoint_num_cpus=0,
                    runtime_env=runtime_env,
                    metadata=job.metadata,
                )
            except (ValueError, RuntimeError) as e:  # Ray's client, or its dashboard (500)
                limit = re.search(r"Package size \(.*?\) exceeds the maximum size of \S+", str(e))
                if not limit:
                    raise
                raise WorkingDirTooLargeError(
                    f"the working directory {job.upload_dir} is too large for Ray to upload"
                    f" ({limit.group(0).rstrip('.')}): exclude files with .torchxignore, or run"
                    " in a directory on the cluster (-cfg working_dir=<path on the cluster>)"
                ) from None
        return _app_id(job.address, job.app_id)

    def progress_path(self, app_id: str) -> Optional[str]:
        """The first replica's last report, from the job log's last ``TAIL_LINES`` lines (the
        dashboard's log API: Ray's Python ``get_log`` wants the GCS address), else from the
        whole log (chatty replicas; a cluster with auth), cached in this process's
        ``$TORCHX_HOME`` (the Runner reads progress from a file)."""
        url, job_id = _split(app_id)
        query = urllib.parse.urlencode(
            {"submission_id": job_id, "lines": TAIL_LINES, "timeout": 10}
        )
        url = f"{url}/api/v0/logs/file?{query}"
        try:
            with urllib.request.urlopen(url, timeout=15) as r:
                report = last_progress(r.read().decode(errors="replace").splitlines())
        except OSError:  # URLError, HTTPError, timeouts: the whole log below
            report = None
        if report is None:
            report = last_progress(self._logs(app_id).splitlines())
        if not report:
            return None
        path = str(torchx_home() / "ray" / f"{job_id}.progress.json")
        write_private(path, report)
        return path

    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        url, job_id = _split(app_id)
        client = self._client(url)
        try:
            info = client.get_job_info(job_id)
        except RuntimeError:
            return None
        req = _request_of(info)
        state = _state(info.status)
        app = appdef_from_dict(req["app"]) if req else None
        msg = info.message or NONE
        if state == AppState.RUNNING:  # the driver runs; its replicas may wait for resources
            waiting = placement_wait(url, job_id)
            if waiting is not None:
                state, msg = AppState.PENDING, waiting
        meta = info.metadata or {}  # the Ray job's own
        carried = {IDEMPOTENCY_TOKEN: meta.get(META_IDEMPOTENCY_TOKEN), OWNER: meta.get(META_OWNER)}
        codes: Dict[str, Optional[int]] = {}
        if is_terminal(state):
            logs = client.get_job_logs(job_id)
            m = re.findall(r"torchx-exit-codes (\{.*\})", logs)
            codes = json.loads(m[-1]) if m else {}
            if state == AppState.FAILED and "No module named torchx" in logs:
                msg = NO_TORCHX_ON_CLUSTER
            elif state == AppState.FAILED:
                msg = stall_reason_in(logs[-65536:]) or msg
        by_code = is_terminal(state) and state != AppState.CANCELLED  # else: the job's state
        roles = []
        for role in app.roles if app else []:
            reps = []
            for i in range(role.num_replicas):
                ok = codes.get(f"{role.name}/{i}") == 0
                rs = (AppState.SUCCEEDED if ok else AppState.FAILED) if by_code else state
                reps.append(ReplicaStatus(i, rs, role.name, "", NONE))
            roles.append(RoleStatus(role.name, reps))
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            num_restarts=0,
            msg=msg,
            roles_statuses=roles,
            # the request's (e.g. the stall timeout), then what the Ray job itself carries
            metadata={
                **{k: v for k, v in (app.metadata if app else {}).items() if v},
                **{k: v for k, v in carried.items() if v},
            },
            roles=app.roles if app else [],
            ui_url=f"{url}/#/jobs/{job_id}",
        )

    def list(self) -> List[ListAppResponse]:
        address = _env_address()
        return [self._entry(address, job) for job in self._torchx_jobs(address)]

    def find_by_idempotency_token(
        self, token: str, cfg: Optional[Mapping[str, CfgVal]] = None
    ) -> List[ListAppResponse]:
        """Ray's start time orders them; the Job Submission API cannot filter: all are listed."""
        address = str((cfg or {}).get("dashboard_address") or _env_address())
        jobs = self._torchx_jobs(address)
        jobs = [j for j in jobs if j.metadata.get(META_IDEMPOTENCY_TOKEN) == token]
        jobs.sort(key=lambda j: (j.start_time or 0, j.submission_id))
        return [self._entry(address, job) for job in jobs]

    def _name_taken(self, e: Exception) -> bool:
        """Ray refuses a reused ``submission_id`` (live or stopped job)."""
        return isinstance(e, (RuntimeError, ValueError)) and "already exists" in str(e)

    def _torchx_jobs(self, address: str) -> List[Any]:
        jobs = self._client(address).list_jobs()
        return [j for j in jobs if (j.metadata or {}).get(META_TORCHX) == "1" and j.submission_id]

    @staticmethod
    def _entry(address: str, job: Any) -> ListAppResponse:
        name = (job.metadata or {}).get(META_APP_NAME, "")
        app_id = _app_id(address, job.submission_id)
        return ListAppResponse(app_id, _state(job.status), name=name)

    def _cancel_existing(self, app_id: str) -> None:
        url, job_id = _split(app_id)
        self._client(url).stop_job(job_id)

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
        prefix = f"{role_name}/{k} "
        if should_tail:
            return filter_regex(regex, self._follow(app_id, prefix))
        return filter_regex(regex, self._select(self._logs(app_id), prefix))

    def _logs(self, app_id: str) -> str:
        url, job_id = _split(app_id)
        return self._client(url).get_job_logs(job_id)

    @staticmethod
    def _select(text: str, prefix: str) -> Iterator[str]:
        for line in text.splitlines(keepends=True):
            line = ACTOR_PREFIX.sub("", line)  # Ray prefixes actor output "(Replica pid=N)"
            if line.startswith(prefix):
                yield line[len(prefix) :]

    def _follow(self, app_id: str, prefix: str) -> Iterator[str]:
        seen = 0
        while True:
            desc = self.describe(app_id)
            ended = desc is None or is_terminal(desc.state)
            text = self._logs(app_id)
            lines = text.splitlines(keepends=True)
            complete = lines if text.endswith("\n") or ended else lines[:-1]  # whole lines
            yield from self._select("".join(complete[seen:]), prefix)
            seen = len(complete)
            if ended:
                return
            time.sleep(0.5)


def _state(status: Any) -> AppState:
    """A Ray ``JobStatus`` (its ``str`` is its value) as an ``AppState``."""
    return RAY_STATES.get(str(status), AppState.UNKNOWN)


def _env_address(default: str = "127.0.0.1:8265") -> str:
    """The dashboard this process's environment names, as Ray's client reads it."""
    return os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS") or default


def _app_id(address: str, job_id: str) -> str:
    """The app id of Ray job ``job_id`` at ``address``: ``host:port-<job id>`` (upstream's
    form) where the handle can carry the address (plain http, no path), else the job id."""
    parts = urllib.parse.urlsplit(dashboard_url(address))
    if parts.scheme != "http" or parts.path.strip("/") or "@" in parts.netloc or not parts.netloc:
        return job_id
    netloc = parts.netloc if re.search(r":\d+$", parts.netloc) else f"{parts.netloc}:80"
    return f"{netloc}-{job_id}"


def _split(app_id: str) -> tuple[str, str]:
    """(dashboard URL, Ray submission id) of an app id; an id without an address (a job id
    never holds ``:``) is at the address this process's environment names."""
    m = re.match(r"^([^/@\s]+?:\d+)-(.+)$", app_id)
    if m:
        return f"http://{m.group(1)}", m.group(2)
    return dashboard_url(_env_address()), app_id


def _request_of(info: Any) -> Optional[Dict[str, Any]]:
    """The request a torchx job carries in its runtime_env (None: not torchx's)."""
    env = (info.runtime_env or {}).get("env_vars")
    try:
        return decode_request(env[REQUEST_ENV]) if env and env.get(REQUEST_ENV) else None
    except (ValueError, TypeError, zlib.error):  # not one of ours
        return None


def create_scheduler(session_name: str, **kwargs: Any) -> RayScheduler:
    return RayScheduler(session_name)
