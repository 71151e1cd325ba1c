"""What a job's tracker run records about the job: its name and params (env values and
secrets masked: torchx.specs.secrets), and at its end its last report, hours and failure reason."""

from __future__ import annotations

import copy
import json
import logging
import shlex
import time
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from torchx.runner.resource_hours import CPU_HOURS, ResourceHours, job_start, resource_hours
from torchx.runner.tracker_session import TrackerSession, warn_on_error
from torchx.runtime.progress import PROGRESS_KEYS, Progress, progress_from_metrics
from torchx.schedulers.api import Scheduler
from torchx.specs.api import AppDef, AppDryRunInfo, AppState, Role
from torchx.specs.errors import backend_errors
from torchx.specs.secrets import MASK, mask_args, mask_value
from torchx.trackers.env import ENV_TORCHX_TRACKERS, tracker_config_env_var_name
from torchx.util.types import to_dict

if TYPE_CHECKING:
    from torchx.trackers.api import JobRun, TrackerBackend

logger = logging.getLogger(__name__)

MAX_PARAM = 6000  # MLflow's limit on a param value
REDACTED = MASK  # what an env value, or a secret (torchx.specs.secrets), is recorded as
_ENV_FLAGS = ("--env", "-env", "--e", "-e")
# dist.ddp's placeholder experiment: keep a pipeline's stages with their pipeline run
_PLACEHOLDER_EXPERIMENT = "default-experiment"

# a FAILED app's reason on its run (a tag: the description is the user's; docs/progress.md)
FAILURE_REASON_TAG = "torchx.failure_reason"
MAX_TAG = 5000
_ENDED = ("FINISHED", "FAILED", "KILLED")  # an MLflow run's terminal statuses

ComponentCall = Tuple[str, Union[List[str], Dict[str, Any]]]


@dataclass
class RunRequest:
    """What the caller of ``Runner.run`` says about the job's run."""

    name: Optional[str] = None
    params: Dict[str, object] = field(default_factory=dict)
    component: Optional[ComponentCall] = None
    cfg: Dict[str, object] = field(default_factory=dict)


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _redact_pairs(text: str) -> str:
    """``K=V,K2=V2`` -> ``K=<redacted>,K2=<redacted>``: names stay, values never leave.
    Parsed as the component parses its env (``to_dict``: ``K=a,b`` is one value); what
    does not parse is redacted whole."""
    try:
        names = to_dict(text)
    except ValueError:
        return REDACTED
    return ",".join(f"{k}={REDACTED}" for k in names)


def redact_args(args: Union[List[str], Dict[str, Any]]) -> Union[List[str], Dict[str, Any]]:
    """Component args without env values (``--env K=V``, ``--env=K=V``, ``{"env": {...}}``)
    and with secrets masked (``--hf_token X``, URL credentials: ``mask_args``)."""
    if isinstance(args, dict):
        out = dict(args)
        env = out.get("env")
        if isinstance(env, Mapping):
            out["env"] = {k: REDACTED for k in env}
        elif isinstance(env, str):
            out["env"] = _redact_pairs(env)
        return mask_args(out)
    redacted: List[str] = []
    after_flag = False
    for arg in (str(a) for a in args):
        flag, eq, value = arg.partition("=")
        if after_flag:
            arg = _redact_pairs(arg)
        elif eq and flag in _ENV_FLAGS:
            arg = f"{flag}={_redact_pairs(value)}"
        after_flag = arg in _ENV_FLAGS
        redacted.append(arg)
    return mask_args(redacted)


def job_params(app: AppDef, scheduler: str, request: RunRequest) -> Dict[str, str]:
    """The run's params: what ran (component, args without env values), where (scheduler,
    cfg), on what (per role: replicas, cpu, memMB, gpu), the env names the roles were
    given, plus the orchestrator's own params (sensitive ones redacted)."""
    params = {str(k): _text(mask_value(str(k), v)) for k, v in request.params.items()}
    if request.component is not None:
        params["component"] = request.component[0]
        args = redact_args(request.component[1])
        params["args"] = _text(args) if isinstance(args, dict) else shlex.join(args)
    else:
        params["component"] = app.name
        params["args"] = _text({r.name: [r.entrypoint, *r.args] for r in app.roles})
    params["scheduler"] = scheduler
    params["cfg"] = _text(mask_value("", {k: v for k, v in request.cfg.items() if v is not None}))
    for role in app.roles:
        res, prefix = role.resource, f"resources.{role.name}"
        values = (role.num_replicas, res.cpu, res.memMB, res.gpu)
        for key, value in zip(("replicas", "cpu", "memMB", "gpu"), values, strict=True):
            params[f"{prefix}.{key}"] = str(value)
    return {k[:250]: v[:MAX_PARAM] for k, v in params.items()}


def job_run(app: AppDef, scheduler: str, request: Optional[RunRequest], start_ms: int) -> JobRun:
    """What the Runner tells each tracker about the job whose run it opens."""
    request = request or RunRequest()
    env = app.roles[0].env if app.roles else {}
    experiment = env.get("TORCHX_TRACKING_EXPERIMENT_NAME")
    from torchx.trackers.api import JobRun  # a job with trackers only

    return JobRun(
        name=request.name or app.name,
        params=job_params(app, scheduler, request),
        parent_run_id=env.get("TORCHX_PARENT_RUN_ID") or None,
        experiment_name=None if experiment == _PLACEHOLDER_EXPERIMENT else experiment,
        start_ms=start_ms,
    )


def trackers_of(app: AppDef) -> Dict[str, Optional[str]]:
    """The trackers a dry run put into the app's env (what its jobs will report to)."""
    env = app.roles[0].env if app.roles else {}
    names = [n for n in env.get(ENV_TORCHX_TRACKERS, "").split(",") if n]
    return {n: env.get(tracker_config_env_var_name(n)) for n in names}


def with_env(
    sched: Scheduler, info: AppDryRunInfo[Any], env: Mapping[str, str]
) -> AppDryRunInfo[Any]:
    """The request again, with the job's tracker run (its id) in every role's env."""
    if not env or info.app is None:
        return info
    app = copy.deepcopy(info.app)
    for role in app.roles:
        role.env.update(env)
    return info.keeping_context(sched.submit_dryrun(app, info.cfg))


@dataclass
class _Watch:
    trackers: Dict[str, Optional[str]]
    env: Dict[str, str]
    start: Optional[float]  # epoch s, see torchx.runner.resource_hours


class JobRecorder:
    """What a Runner records on the runs of the apps it watches when they end, then ends the
    runs; best effort: a store that cannot take it is one warning."""

    def __init__(
        self,
        session: TrackerSession,
        apps: Mapping[str, AppDef],
        default_trackers: Callable[[], Dict[str, Optional[str]]],
        read_progress: Callable[[str], Optional[Progress]],
    ) -> None:
        self._session = session
        self._apps = apps  # the Runner's own submissions (their roles carry the run's env)
        self._default_trackers = default_trackers
        self._read_progress = read_progress
        self._watched: Dict[str, _Watch] = {}
        self.hours: Dict[str, ResourceHours] = {}  # apps it saw end

    def _job(
        self, handle: str, roles: Sequence[Role]
    ) -> Tuple[Sequence[Role], Dict[str, str], Dict[str, Optional[str]]]:
        """The app's roles, env and trackers (the Runner's, if its scheduler returns no env)."""
        app = self._apps.get(handle)
        roles = app.roles if app is not None else roles
        env: Dict[str, str] = dict(roles[0].env) if roles else {}
        if ENV_TORCHX_TRACKERS in env:
            return roles, env, trackers_of(AppDef("app", list(roles)))
        return roles, env, self._default_trackers()

    def watch(self, handle: str, roles: Sequence[Role], start: Optional[float] = None) -> None:
        """The app is this Runner's to record (first call wins); ``start``: when it was
        submitted, if the job's env does not say."""
        if handle not in self._watched:
            _, env, trackers = self._job(handle, roles)
            self._watched[handle] = _Watch(trackers, env, job_start(env) or start)

    def _report(self, handle: str) -> Optional[Progress]:
        try:
            return self._read_progress(handle)
        except backend_errors() as e:  # a report is never worth failing a wait
            logger.warning("could not read the progress of %s: %s", handle, e)
            return None

    def _runs(
        self, trackers: Mapping[str, Optional[str]], handle: str, env: Mapping[str, str]
    ) -> Iterator[Tuple[TrackerBackend, str]]:
        """Each tracker's backend and the job's run in it (trackers without one skipped)."""
        for backend in self._session.backends(trackers):
            run_id = backend.job_run_id(handle, env)
            if run_id:
                yield backend, run_id

    def fill_in_report(self, watch: _Watch, handle: str, report: Optional[Progress]) -> None:
        """``report`` (the progress file's last) onto each run that lacks it: a rank killed
        before its last batch left keeps at least its last step (docs/progress.md)."""
        if report is None or report.from_tracker:
            return  # no file: what the run has is all there is
        ts = report.time_ms
        for backend, run_id in self._runs(watch.trackers, handle, watch.env):
            if self._run_has(backend, run_id, handle, report.step, ts):
                continue
            what, metrics = f"record the last progress report of {handle}", report.as_metrics()
            warn_on_error(backend, what, backend.log_job_run, run_id, metrics, report.step, {}, ts)

    @staticmethod
    def _run_has(backend: TrackerBackend, run_id: str, handle: str, step: int, ts: int) -> bool:
        """Whether the run's newest progress report is ``step``, sent at ``ts`` (ms) or later."""
        # cannot tell: False (a point twice beats a lost last step)
        read = backend.job_run_latest
        latest = warn_on_error(backend, f"read the run of {handle}", read, run_id, PROGRESS_KEYS)
        on_run = progress_from_metrics(latest or {})
        return on_run is not None and on_run.step == step and round(on_run.time * 1000) >= ts

    def end(self, handle: str, roles: Sequence[Role], state: AppState, msg: str) -> None:
        """Record the app's end on its runs (the last report, resource-hours, a FAILED app's
        reason), then end them with ``state``. A late look (this Runner did not watch the
        app) after a watching Runner recorded the end adds nothing and leaves an ended run
        as it is (docs/tracking.md)."""
        roles, env, trackers = self._job(handle, roles)
        seen = time.time()  # one end for the hours and the run (recording takes time)
        watch = self._watched.get(handle)
        late = watch is None
        if watch is None:
            watch = self._watched[handle] = _Watch(dict(trackers), dict(env), job_start(env))
        settled = late and bool(watch.trackers) and self._recorded(watch, handle, CPU_HOURS)
        if watch.start is not None and not settled:
            self.hours[handle] = resource_hours(roles, watch.start, seen)
        if watch.trackers and not settled:
            self.fill_in_report(watch, handle, self._report(handle))
            tags = {}
            if state == AppState.FAILED and msg and msg != "<NONE>":
                tags[FAILURE_REASON_TAG] = msg.strip()[:MAX_TAG]
            hours = self.hours.get(handle)
            metrics = hours.metrics() if hours is not None else {}
            if metrics or tags:
                for backend, run_id in self._runs(watch.trackers, handle, watch.env):
                    what = f"record metrics of {handle}"
                    warn_on_error(backend, what, backend.log_job_run, run_id, metrics, 0, tags)
        if trackers and not (settled and self._run_ended(trackers, handle, env)):
            self._session.close_job_run(trackers, handle, env, state, int(seen * 1000))

    def tracked_progress(
        self, handle: str, describe: Callable[[str], Optional[AppDef]]
    ) -> Optional[Progress]:
        """The last report a rank sent to the job's tracker run (no progress file)."""
        app = self._apps.get(handle) or describe(handle)
        _, env, trackers = self._job(handle, app.roles if app is not None else [])
        for backend, run_id in self._runs(trackers, handle, env):
            report = progress_from_metrics(backend.job_run_latest(run_id, PROGRESS_KEYS) or {})
            if report is not None:
                return report
        return None

    def _recorded(self, watch: _Watch, handle: str, metric: str) -> bool:
        """Whether the job's run has ``metric`` in any tracker (True if none can tell)."""
        for backend, run_id in self._runs(watch.trackers, handle, watch.env):
            # cannot tell (None): leave the run as it is
            read = backend.job_run_latest
            latest = warn_on_error(backend, f"read the run of {handle}", read, run_id, ())
            if latest is not None and metric not in latest:
                return False
        return True

    def _run_ended(
        self, trackers: Mapping[str, Optional[str]], handle: str, env: Mapping[str, str]
    ) -> bool:
        """Whether the job's run is ended (not RUNNING) in every tracker; False if one cannot
        tell (``job_run_status``): a run RUNNING forever is worse than a moved end time."""
        for backend in self._session.backends(trackers):
            run_id = backend.job_run_id(handle, env)
            if not run_id:
                return False
            what = f"read the status of the run of {handle}"
            if warn_on_error(backend, what, backend.job_run_status, run_id) not in _ENDED:
                return False  # not ended, or cannot tell (None): end it
        return True
