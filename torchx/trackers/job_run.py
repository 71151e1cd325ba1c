"""The job's tracker run, owned by the launcher: opened at submit, ended with the app.

The Runner opens the run when it schedules a job (so a job that never calls the tracker,
or crashes before it does, still has one) and ends it FINISHED, FAILED or KILLED when it
sees the app end. The job's ranks only attach to it. Nothing here imports a tracker
backend's heavy client on the submit path: backends do their work however is cheapest
(see ``torchx.trackers.mlflow_launch``).
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from torchx.specs.api import AppState
from torchx.trackers.api import (
    ENV_TORCHX_RUN_OWNER,
    LAUNCHER,
    close_job_run,
    open_job_run,
)

logger = logging.getLogger(__name__)

# dist.ddp's placeholder experiment: keep a pipeline's stages with their pipeline run
_PLACEHOLDER_EXPERIMENT = "default-experiment"
_RUN_STATUS = {
    AppState.SUCCEEDED: "FINISHED",
    AppState.FAILED: "FAILED",
    AppState.CANCELLED: "KILLED",
}

ComponentCall = Tuple[str, Union[List[str], Dict[str, Any]]]


@dataclass
class RunRequest:
    """What the caller of ``Runner.run`` says about the job's run."""

    name: Optional[str] = None
    params: Dict[str, object] = field(default_factory=dict)
    component: Optional[ComponentCall] = None
    cfg: Dict[str, object] = field(default_factory=dict)


@dataclass
class JobRun:
    """Everything a backend needs to open a job's run."""

    job_id: str
    name: str
    params: Dict[str, str]
    parent_run_id: Optional[str] = None
    experiment_name: Optional[str] = None
    start_ms: int = field(default_factory=lambda: int(time.time() * 1000))


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _args_text(args: Union[List[str], Dict[str, Any]]) -> str:
    if isinstance(args, dict):
        return _text(args)
    return shlex.join(str(a) for a in args)


MAX_PARAM = 6000  # MLflow's limit on a param value


def job_params(app: Any, scheduler: str, request: RunRequest) -> Dict[str, str]:
    """The run's params: what ran (component, args), where (scheduler, cfg), on what
    (per role: replicas, cpu, memMB, gpu), plus the orchestrator's own params."""
    params: Dict[str, str] = {str(k): _text(v) for k, v in request.params.items()}
    if request.component is not None:
        params["component"] = request.component[0]
        params["args"] = _args_text(request.component[1])
    else:
        params["component"] = app.name
        params["args"] = _text({r.name: [r.entrypoint, *r.args] for r in app.roles})
    params["scheduler"] = scheduler
    params["cfg"] = _text({k: v for k, v in request.cfg.items() if v is not None})
    for role in app.roles:
        res = role.resource
        prefix = f"resources.{role.name}"
        params[f"{prefix}.replicas"] = str(role.num_replicas)
        params[f"{prefix}.cpu"] = str(res.cpu)
        params[f"{prefix}.memMB"] = str(res.memMB)
        params[f"{prefix}.gpu"] = str(res.gpu)
    return {k[:250]: v[:MAX_PARAM] for k, v in params.items()}


def mark_launcher_owned(app: Any) -> None:
    """Tell the job's ranks (through their env) that the launcher owns the run."""
    for role in app.roles:
        role.env[ENV_TORCHX_RUN_OWNER] = LAUNCHER


def launcher_owned(roles: Any) -> bool:
    return any(r.env.get(ENV_TORCHX_RUN_OWNER) == LAUNCHER for r in roles)


def open_run(
    trackers: Mapping[str, Optional[str]],
    handle: str,
    app: Any,
    scheduler: str,
    request: Optional[RunRequest],
    start_ms: int,
) -> None:
    """Open the job's run; a tracker that fails is logged (the job is already running)."""
    request = request or RunRequest()
    env = app.roles[0].env if app.roles else {}
    experiment = env.get("TORCHX_TRACKING_EXPERIMENT_NAME")
    job = JobRun(
        job_id=handle,
        name=request.name or app.name,
        params=job_params(app, scheduler, request),
        parent_run_id=env.get("TORCHX_PARENT_RUN_ID") or None,
        experiment_name=None if experiment == _PLACEHOLDER_EXPERIMENT else experiment,
        start_ms=start_ms,
    )
    try:
        open_job_run(trackers, **job.__dict__)
    except Exception as e:
        logger.warning("could not open the tracker run of %s: %s", handle, e)


def close_run(
    trackers: Mapping[str, Optional[str]], handle: str, state: AppState, wait: bool
) -> None:
    """End the job's run with the app's terminal ``state`` (best effort, logged)."""
    status = _RUN_STATUS.get(state, "FAILED")
    try:
        close_job_run(trackers, handle, status, int(time.time() * 1000), wait)
    except Exception as e:
        logger.warning("could not end the tracker run of %s as %s: %s", handle, status, e)


def flush_job_runs() -> None:
    """Return once this process's launcher-side tracker work (runs opened or ended in the
    background, e.g. on a sqlite store) is done: for tests and scripts that read the run
    right after ``Runner.wait``."""
    backend = sys.modules.get("torchx.trackers.mlflow_backend")
    agent = getattr(backend, "_launcher_agent", None)
    if agent is not None:
        agent.flush()
