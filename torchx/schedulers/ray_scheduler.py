"""``ray``: submit an app through Ray's Job Submission API to a Ray cluster.

The job's entrypoint is ``torchx.schedulers.ray_driver`` run by the same Python that
submitted it (Ray's own entrypoint would use the ``PATH`` of ``ray start``), which places
one actor per replica in a placement group and runs the replica's command there. Logs are
the job's logs, each line prefixed ``role/replica``. ``cancel`` stops the job; the driver
then ends every replica's process tree. The request file is written under
``$TORCHX_HOME/ray`` and must be readable by the cluster's head (a local or shared-FS
cluster running as the submitting user): it holds the replicas' environment, which may
carry secrets, so it is private to its owner (0600, in a 0700 directory). A keyed
submission (``Runner.run(idempotency_key=...)``) puts its token in the Ray job's metadata,
and ``Runner.run(owner=...)`` its owner; ``describe`` returns both.

Stalls (``Runner.run(stall_timeout=...)``) are detected by whoever waits: the driver
publishes the replicas' last output or progress report beside the request file
(``last_activity``, see ``ray_driver``), and a waiter that stops a stalled job
(``stop_stalled``) first writes ``<app>.stalled`` there. Ray's job metadata is fixed at
submission and ``stop_job`` takes no message, so that file, in the directory the job's
own request lives in (which ``describe`` already reads for the AppDef), is where the
reason stays with the job: a STOPPED job with it is FAILED with it for every reader.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional

from torchx.schedulers.api import (
    IDEMPOTENCY_TOKEN,
    OWNER,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    app_idempotency_token,
    filter_regex,
)
from torchx.schedulers.ids import unique_name
from torchx.schedulers.ray_driver import PUBLISH_INTERVAL, dashboard_url
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
from torchx.util.modules import import_optional
from torchx.util.paths import torchx_home

_ACTOR_PREFIX = re.compile(r"^(\x1b\[[0-9;]*m)?\([^)]*pid=\d+[^)]*\)(\x1b\[[0-9;]*m)?\s")
META_TORCHX = "torchx"
META_APP_NAME = "app_name"
META_IDEMPOTENCY_TOKEN = "idempotency_token"
META_OWNER = "owner"
RAY_STATES = {
    "PENDING": AppState.PENDING,
    "RUNNING": AppState.RUNNING,
    "SUCCEEDED": AppState.SUCCEEDED,
    "FAILED": AppState.FAILED,
    "STOPPED": AppState.CANCELLED,
}
# an activity record the driver has not refreshed for this long is stale: cannot tell
ACTIVITY_STALE_AFTER = 30 * PUBLISH_INTERVAL


@dataclass
class RayJob:
    app_id: str
    address: str
    replicas: List[Dict[str, Any]]
    working_dir: str
    spread: bool = False
    app: Dict[str, Any] = field(default_factory=dict)
    idempotency_token: Optional[str] = None
    owner: Optional[str] = None

    @property
    def metadata(self) -> Dict[str, str]:
        """The Ray job's metadata: marks it as torchx's, and carries the token and owner if
        any."""
        meta = {META_TORCHX: "1", META_APP_NAME: self.app.get("name", ""), "address": self.address}
        if self.idempotency_token:
            meta[META_IDEMPOTENCY_TOKEN] = self.idempotency_token
        if self.owner:
            meta[META_OWNER] = self.owner
        return meta

    def entrypoint(self, request_path: str) -> str:
        driver = "torchx.schedulers.ray_driver"
        return f"{shlex.quote(sys.executable)} -m {driver} {shlex.quote(request_path)}"

    def __repr__(self) -> str:
        lines = [f"ray job {self.app_id} on {self.address} (cwd {self.working_dir})"]
        if self.idempotency_token:
            lines.append(f"  idempotency token: {self.idempotency_token}")
        for r in self.replicas:
            lines.append(
                f"  {r['role']}/{r['replica_id']} [{r['cpu']} cpu]: {shlex.join(r['args'])}"
            )
        return "\n".join(lines)


class RayScheduler(Scheduler[RayJob]):
    def __init__(self, session_name: str) -> None:
        super().__init__("ray", session_name)

    def _run_opts(self) -> runopts:
        opts = runopts()
        opts.add(
            "dashboard_address",
            type_=str,
            default=os.environ.get("RAY_API_SERVER_ADDRESS")
            or os.environ.get("RAY_ADDRESS")
            or "127.0.0.1:8265",
            help="Ray dashboard (job submission) address ($RAY_API_SERVER_ADDRESS or $RAY_ADDRESS)",
        )
        opts.add("working_dir", type_=str, help="directory the replicas run in (default: cwd)")
        opts.add(
            "spread",
            type_=bool,
            default=False,
            help="place replicas on different nodes when possible",
        )
        return opts

    def _client(self, address: str) -> Any:
        js = import_optional("ray.job_submission", "ray")
        url = dashboard_url(address)
        # Ray prefers $RAY_API_SERVER_ADDRESS/$RAY_ADDRESS over the argument: make them agree
        saved = {
            k: os.environ.pop(k)
            for k in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
            if k in os.environ
        }
        try:
            return js.JobSubmissionClient(url)
        finally:
            os.environ.update(saved)

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[RayJob]:
        from torchx.specs.serialize import appdef_to_dict

        app_id = unique_name(app.name, max_base=40, suffix_length=8)
        replicas = []
        for role in app.roles:
            elastic = role.min_replicas is not None and role.min_replicas < role.num_replicas
            for i in range(role.num_replicas):
                values = macros.Values(
                    img_root=str(cfg.get("working_dir") or os.getcwd()),
                    app_id=app_id,
                    replica_id=str(i),
                    rank0_env="TORCHX_RANK0_HOST",
                )
                r = values.apply(role)
                env = dict(r.env)
                env.setdefault("PYTHONUNBUFFERED", "1")
                env["PATH"] = (
                    os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
                )
                replicas.append(
                    {
                        "role": role.name,
                        "replica_id": i,
                        "args": [r.entrypoint, *r.args],
                        "env": env,
                        "cpu": max(r.resource.cpu, 1) if r.resource.cpu > 0 else 1,
                        "elastic": elastic,
                        "min_replicas": role.min_replicas or role.num_replicas,
                    }
                )
        job = RayJob(
            app_id,
            str(cfg.get("dashboard_address")),
            replicas,
            str(cfg.get("working_dir") or os.getcwd()),
            bool(cfg.get("spread")),
            appdef_to_dict(app),
            app_idempotency_token(app),
            app.metadata.get(OWNER) or None,
        )
        return AppDryRunInfo(job, repr)

    def _request_path(self, app_id: str) -> str:
        return str(torchx_home() / "ray" / f"{app_id}.json")

    def schedule(self, dryrun_info: AppDryRunInfo[RayJob]) -> str:
        job = dryrun_info.request
        path = self._request_path(job.app_id)
        request = {
            "replicas": job.replicas,
            "working_dir": job.working_dir,
            "spread": job.spread,
            "address": job.address,
            "app": job.app,
        }
        _write_private(path, json.dumps(request))
        client = self._client(job.address)
        client.submit_job(
            entrypoint=job.entrypoint(path),
            submission_id=job.app_id,
            entrypoint_num_cpus=0,
            metadata=job.metadata,
        )
        return job.app_id

    def _beside(self, app_id: str, suffix: str) -> str:
        """A file of the job beside its request (``<app>.json`` -> ``<app><suffix>``)."""
        return self._request_path(app_id)[: -len(".json")] + suffix

    def progress_path(self, app_id: str) -> Optional[str]:
        return self._beside(app_id, ".progress.json")

    def last_activity(self, app_id: str) -> Optional[float]:
        """When a replica last printed or reported progress, as the driver last published
        it; None before the driver's first round, once it stopped refreshing it, or once no
        replica runs (the job is ending: not a stall).

        Only the silence the replicas' nodes measured counts (``now - silence``): a round
        published late, an actor slow to answer (a loaded node) or clock skew between
        nodes never makes a job that prints look silent."""
        try:
            with open(self._beside(app_id, ".activity.json")) as f:
                record = json.load(f)
            silence, checked = float(record["silence"]), float(record["checked"])
            running = int(record["running"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        now = time.time()
        if now - checked > ACTIVITY_STALE_AFTER or running == 0:
            return None
        return now - silence

    def stop_stalled(self, app_id: str, reason: str) -> None:
        path = self._beside(app_id, ".stalled")
        _write_private(path, reason)  # first: seen when stopped
        try:
            self.cancel(app_id)
        except Exception:  # the job runs on: a later stop is not a stall
            with contextlib.suppress(OSError):
                os.remove(path)
            raise

    def _stall(self, app_id: str) -> Optional[str]:
        try:
            with open(self._beside(app_id, ".stalled")) as f:
                return f.read().strip() or None
        except OSError:
            return None

    def _request(self, app_id: str) -> Optional[Dict[str, Any]]:
        try:
            with open(self._request_path(app_id)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _address(self, app_id: str) -> str:
        req = self._request(app_id)
        return req["address"] if req else str(self.run_opts().get("dashboard_address").default)  # type: ignore[union-attr]

    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        req = self._request(app_id)
        client = self._client(self._address(app_id))
        try:
            info = client.get_job_info(app_id)
        except RuntimeError:
            return None
        state = RAY_STATES.get(
            str(info.status.value if hasattr(info.status, "value") else info.status),
            AppState.UNKNOWN,
        )
        from torchx.specs.serialize import appdef_from_dict

        app = appdef_from_dict(req["app"]) if req else None
        msg = info.message or NONE
        stalled = self._stall(app_id) if state == AppState.CANCELLED else None
        if stalled:  # stopped by a waiter as stalled: FAILED, with why
            state, msg = AppState.FAILED, stalled
        codes: Dict[str, Optional[int]] = {}
        if is_terminal(state):
            m = re.findall(r"torchx-exit-codes (\{.*\})", client.get_job_logs(app_id))
            codes = json.loads(m[-1]) if m else {}
        roles = []
        for role in app.roles if app else []:
            reps = []
            for i in range(role.num_replicas):
                code = codes.get(f"{role.name}/{i}")
                if state == AppState.CANCELLED or stalled:
                    rs = AppState.CANCELLED if not stalled else AppState.FAILED
                elif is_terminal(state):
                    rs = AppState.SUCCEEDED if code == 0 else AppState.FAILED
                else:
                    rs = state
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
                **_app_metadata(info.metadata or {}),
            },
            roles=app.roles if app else [],
            ui_url=f"http://{self._address(app_id).split('://')[-1]}/#/jobs/{app_id}",
        )

    def list(self) -> List[ListAppResponse]:
        return [self._entry(job) for job in self._torchx_jobs()]

    def find_by_idempotency_token(self, token: str) -> List[ListAppResponse]:
        """Jobs whose metadata carries ``token``, oldest first (Ray's start time, app id).

        The Job Submission API cannot filter: this lists the cluster's jobs and filters
        their metadata here.

        Ray has no claim and no held submission: of racing submitters each job starts
        its entrypoint and the losers are stopped at once.
        """
        jobs = [j for j in self._torchx_jobs() if j.metadata.get(META_IDEMPOTENCY_TOKEN) == token]
        jobs.sort(key=lambda j: (j.start_time or 0, j.submission_id))
        return [self._entry(job) for job in jobs]

    def _torchx_jobs(self) -> List[Any]:
        client = self._client(str(self.run_opts().get("dashboard_address").default))  # type: ignore[union-attr]
        return [
            job
            for job in client.list_jobs()
            if (job.metadata or {}).get(META_TORCHX) == "1" and job.submission_id
        ]

    @staticmethod
    def _entry(job: Any) -> ListAppResponse:
        status = str(job.status.value if hasattr(job.status, "value") else job.status)
        return ListAppResponse(
            job.submission_id,
            RAY_STATES.get(status, AppState.UNKNOWN),
            name=(job.metadata or {}).get(META_APP_NAME, ""),
        )

    def _cancel_existing(self, app_id: str) -> None:
        self._client(self._address(app_id)).stop_job(app_id)

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
        lines = (
            self._follow(app_id, prefix)
            if should_tail
            else self._select(self._logs(app_id), prefix)
        )
        return filter_regex(regex, lines)

    def _logs(self, app_id: str) -> str:
        return self._client(self._address(app_id)).get_job_logs(app_id)

    @staticmethod
    def _select(text: str, prefix: str, skip: int = 0) -> Iterator[str]:
        for line in text.splitlines(keepends=True)[skip:]:
            line = _ACTOR_PREFIX.sub("", line)  # Ray prefixes actor output with "(Replica pid=N)"
            if line.startswith(prefix):
                yield line[len(prefix) :]

    def _follow(self, app_id: str, prefix: str) -> Iterator[str]:
        seen = 0
        while True:
            desc = self.describe(app_id)
            text = self._logs(app_id)
            lines = text.splitlines(keepends=True)
            complete = (
                lines if text.endswith("\n") or (desc and is_terminal(desc.state)) else lines[:-1]
            )
            yield from self._select("".join(complete[seen:]), prefix)
            seen = len(complete)
            if desc is None or is_terminal(desc.state):
                return
            time.sleep(0.5)


def _write_private(path: str, text: str) -> None:
    """Write ``path`` readable by its owner only (0600, directory 0700), atomically."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            os.fchmod(f.fileno(), 0o600)  # O_CREAT's mode does not apply to an existing file
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _app_metadata(meta: Mapping[str, str]) -> Dict[str, str]:
    """The app metadata a Ray job stores (token, owner), as ``DescribeAppResponse.metadata``."""
    found = {IDEMPOTENCY_TOKEN: meta.get(META_IDEMPOTENCY_TOKEN), OWNER: meta.get(META_OWNER)}
    return {k: v for k, v in found.items() if v}


def create_scheduler(session_name: str, **kwargs: Any) -> RayScheduler:
    return RayScheduler(session_name)
