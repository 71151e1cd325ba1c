"""The job's tracker run, owned by the Runner that submits the job.

The Runner opens the run *before* it submits the job, so the run exists when submit
returns and its id travels with the job in every role's env (MLflow: ``MLFLOW_RUN_ID``,
``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_ID``). Any Runner that sees the app end
(``wait``, ``status``, ``cancel``) ends the run by that id. A run that cannot be opened
fails the submit with one line; one that cannot be ended is one warning line.
"""

from __future__ import annotations

import json
import logging
import shlex
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from torchx.specs.api import AppState, TorchXError
from torchx.trackers.api import JobRun, OpenedRun, TrackerBackend, tracker_backend

logger = logging.getLogger(__name__)

# dist.ddp's placeholder experiment: keep a pipeline's stages with their pipeline run
_PLACEHOLDER_EXPERIMENT = "default-experiment"
_RUN_STATUS = {
    AppState.SUCCEEDED: "FINISHED",
    AppState.FAILED: "FAILED",
    AppState.CANCELLED: "KILLED",
}
MAX_PARAM = 6000  # MLflow's limit on a param value
REDACTED = "<redacted>"
_ENV_FLAGS = ("--env", "-env", "--e", "-e")

ComponentCall = Tuple[str, Union[List[str], Dict[str, Any]]]
Trackers = Mapping[str, Optional[str]]


class TrackerRunError(TorchXError):
    """The job's tracker run could not be opened (nothing was submitted)."""


@dataclass
class RunRequest:
    """What the caller of ``Runner.run`` says about the job's run."""

    name: Optional[str] = None
    params: Dict[str, object] = field(default_factory=dict)
    component: Optional[ComponentCall] = None
    cfg: Dict[str, object] = field(default_factory=dict)


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _redact_pairs(text: str) -> str:
    """``K=V,K2=V2`` -> ``K=<redacted>,K2=<redacted>``: names stay, values never leave."""
    return ",".join(f"{p.split('=', 1)[0]}={REDACTED}" for p in text.split(",") if p)


def redact_args(args: Union[List[str], Dict[str, Any]]) -> Union[List[str], Dict[str, Any]]:
    """Component args without env values (``--env K=V``, ``--env=K=V``, ``{"env": {...}}``)."""
    if isinstance(args, dict):
        out = dict(args)
        env = out.get("env")
        if isinstance(env, Mapping):
            out["env"] = {k: REDACTED for k in env}
        elif isinstance(env, str):
            out["env"] = _redact_pairs(env)
        return out
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
    return redacted


def job_params(app: Any, scheduler: str, request: RunRequest) -> Dict[str, str]:
    """The run's params: what ran (component, args without env values), where (scheduler,
    cfg), on what (per role: replicas, cpu, memMB, gpu), the env names the roles were
    given, plus the orchestrator's own params."""
    params: Dict[str, str] = {str(k): _text(v) for k, v in request.params.items()}
    if request.component is not None:
        params["component"] = request.component[0]
        args = redact_args(request.component[1])
        params["args"] = _text(args) if isinstance(args, dict) else shlex.join(args)
    else:
        params["component"] = app.name
        params["args"] = _text({r.name: [r.entrypoint, *r.args] for r in app.roles})
    params["scheduler"] = scheduler
    params["cfg"] = _text({k: v for k, v in request.cfg.items() if v is not None})
    for role in app.roles:
        res, prefix = role.resource, f"resources.{role.name}"
        values = (role.num_replicas, res.cpu, res.memMB, res.gpu)
        for key, value in zip(("replicas", "cpu", "memMB", "gpu"), values, strict=True):
            params[f"{prefix}.{key}"] = str(value)
    return {k[:250]: v[:MAX_PARAM] for k, v in params.items()}


@dataclass
class OpenedJobRun:
    """The runs one submit opened, one per tracker."""

    runs: List[Tuple[TrackerBackend, OpenedRun]]

    @property
    def env(self) -> Dict[str, str]:
        """What the runs add to every role's env (two MLflow trackers: the first wins)."""
        return {k: v for _, run in reversed(self.runs) for k, v in run.env.items()}


class TrackerSession:
    """A Runner's trackers: each backend built once (its client, its store's engine), used
    for every job the Runner submits or sees end, released by ``close``."""

    def __init__(self) -> None:
        self._backends: Dict[Tuple[str, Optional[str]], TrackerBackend] = {}
        self._lock = threading.Lock()

    def backends(self, trackers: Trackers) -> List[TrackerBackend]:
        with self._lock:
            out = []
            for name, config in trackers.items():
                key = (name, config)
                if key not in self._backends:
                    self._backends[key] = tracker_backend(name, config)
                out.append(self._backends[key])
            return out

    def validate(self, trackers: Trackers) -> None:
        for backend in self.backends(trackers):
            backend.validate()

    def open(
        self,
        trackers: Trackers,
        app: Any,
        scheduler: str,
        request: Optional[RunRequest],
        start_ms: int,
    ) -> OpenedJobRun:
        """Open the job's run in every tracker; raises ``TrackerRunError`` naming the store."""
        request = request or RunRequest()
        env = app.roles[0].env if app.roles else {}
        experiment = env.get("TORCHX_TRACKING_EXPERIMENT_NAME")
        job = JobRun(
            name=request.name or app.name,
            params=job_params(app, scheduler, request),
            parent_run_id=env.get("TORCHX_PARENT_RUN_ID") or None,
            experiment_name=None if experiment == _PLACEHOLDER_EXPERIMENT else experiment,
            start_ms=start_ms,
        )
        opened = OpenedJobRun([])
        for backend in self.backends(trackers):
            try:
                opened.runs.append((backend, backend.open_job_run(job)))
            except Exception as e:
                self.abort(opened)
                raise TrackerRunError(
                    f"could not open the job's tracker run in {_store(backend)}: {_reason(e)}"
                ) from e
        return opened

    def bind(self, opened: OpenedJobRun, handle: str) -> None:
        """The job was submitted as ``handle``: record it on each run (a failure warns)."""
        for backend, run in opened.runs:
            what = f"record {handle} on its tracker run"
            _warn_on_error(backend, what, backend.bind_job_run, run.run_id, handle)

    def abort(self, opened: OpenedJobRun) -> None:
        """The submit failed: end the runs it opened as FAILED."""
        for backend, run in opened.runs:
            what = "end the tracker run of a job that was not submitted"
            _warn_on_error(backend, what, backend.close_job_run, "", run.run_id, "FAILED")

    def close_job_run(
        self, trackers: Trackers, handle: str, env: Mapping[str, str], state: AppState
    ) -> None:
        """End the job's run with the app's terminal ``state``; a failure is one warning."""
        status = _RUN_STATUS.get(state, "FAILED")
        end_ms = int(time.time() * 1000)
        for backend in self.backends(trackers):
            what = f"end the tracker run of {handle} as {status}"
            run_id = backend.job_run_id(handle, env)
            _warn_on_error(backend, what, backend.close_job_run, handle, run_id, status, end_ms)

    def close(self) -> None:
        with self._lock:
            for backend in self._backends.values():
                backend.close()
            self._backends.clear()


def _warn_on_error(backend: TrackerBackend, what: str, call: Any, *args: Any) -> None:
    try:
        call(*args)
    except Exception as e:
        logger.warning("could not %s in %s: %s", what, _store(backend), _reason(e))


def _store(backend: TrackerBackend) -> str:
    return str(getattr(backend, "store", None) or f"{backend.name} ({backend.config})")


def _reason(e: BaseException) -> str:
    """The first line of what went wrong, without a driver's SQL dump."""
    text = str(getattr(e, "orig", None) or e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]
