"""What a job's tracker run records about the job: its name and params, from the AppDef and
what the caller of ``Runner.run`` said (component as named, args, scheduler, cfg, per-role
resources, the orchestrator's params). Env values never leave: ``--env K=V`` and
``{"env": {...}}`` are recorded as ``K=<redacted>``.
"""

from __future__ import annotations

import copy
import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from torchx.schedulers.api import Scheduler
from torchx.specs.api import AppDef, AppDryRunInfo
from torchx.trackers.api import ENV_TORCHX_TRACKERS, JobRun, tracker_config_env_var_name

MAX_PARAM = 6000  # MLflow's limit on a param value
REDACTED = "<redacted>"
_ENV_FLAGS = ("--env", "-env", "--e", "-e")
# dist.ddp's placeholder experiment: keep a pipeline's stages with their pipeline run
_PLACEHOLDER_EXPERIMENT = "default-experiment"

ComponentCall = Tuple[str, Union[List[str], Dict[str, Any]]]


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


def job_params(app: AppDef, scheduler: str, request: RunRequest) -> Dict[str, str]:
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


def job_run(app: AppDef, scheduler: str, request: Optional[RunRequest], start_ms: int) -> JobRun:
    """What the Runner tells each tracker about the job whose run it opens."""
    request = request or RunRequest()
    env = app.roles[0].env if app.roles else {}
    experiment = env.get("TORCHX_TRACKING_EXPERIMENT_NAME")
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
    if not env or info._app is None:
        return info
    app = copy.deepcopy(info._app)
    for role in app.roles:
        role.env.update(env)
    new = sched.submit_dryrun(app, info._cfg)
    for attr in ("_workspace", "_run_request"):
        if hasattr(info, attr):
            setattr(new, attr, getattr(info, attr))
    return new
