"""What the KFP launcher step does (plain Python, testable without KFP): submit or
re-attach, stream logs as ``role/replica`` lines, cancel the app on SIGTERM (the step was
terminated), fail with the worker's error, and read back what the stage recorded.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple

from torchx.pipelines import core
from torchx.pipelines.kfp.outputs import StageRecord, read_stage
from torchx.pipelines.owner import kfp_owner
from torchx.pipelines.secrets import stage_secrets
from torchx.runner.api import get_runner
from torchx.runner.tracking import redact_args
from torchx.specs.api import AppDef, Resource
from torchx.specs.secrets import Masker, mask_value
from torchx.util.quantity import cpu_whole_cores, memory_mib


def apply_task_config(
    app: AppDef, cfg: Dict[str, Any], task_config: Optional[Mapping[str, Any]]
) -> None:
    """Forward the launcher task's KFP TaskConfig (resources, env, node selector, tolerations,
    volumes) to the launched app instead of the launcher pod."""
    if not task_config:
        return
    resources = task_config.get("resources") or {}
    limits = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    for role in app.roles:
        r = role.resource
        cpu = cpu_whole_cores(limits["cpu"]) if "cpu" in limits else r.cpu
        mem = memory_mib(limits["memory"]) if "memory" in limits else r.memMB
        gpu = int(limits.get("nvidia.com/gpu", r.gpu))
        role.resource = Resource(
            cpu=cpu, gpu=gpu, memMB=mem, capabilities=dict(r.capabilities), devices=dict(r.devices)
        )
        for item in task_config.get("env") or []:
            if "name" in item and "value" in item:
                role.env[item["name"]] = str(item["value"])
    if task_config.get("node_selector"):
        cfg.setdefault("node_selector", dict(task_config["node_selector"]))
    if task_config.get("tolerations"):
        cfg.setdefault("tolerations", json.dumps(task_config["tolerations"]))


def pipeline_run_id(pipeline_name: str, job_id: str) -> Optional[str]:
    """``kfp://<pipeline>/<job id>``: the tracker run of one pipeline job (None while the job
    id is a placeholder KFP did not substitute)."""
    return f"kfp://{pipeline_name}/{job_id}" if _substituted(job_id) else None


def kfp_mlflow_run() -> Tuple[Optional[str], Optional[Dict[str, Optional[str]]]]:
    """KFP >= 2.17's MLflow run of this task (the job's run nests under it) and, unless
    ``TORCHX_TRACKERS`` is set, ``{"mlflow": $MLFLOW_TRACKING_URI}`` (None: configured)."""
    uri, run_id = os.environ.get("MLFLOW_TRACKING_URI"), os.environ.get("MLFLOW_RUN_ID")
    if not uri or not run_id:
        return None, None
    return run_id, None if "TORCHX_TRACKERS" in os.environ else {"mlflow": uri}


def launcher_key(job_id: str, task_name: str) -> Optional[str]:
    """The idempotency key of a launcher step: pipeline job id + task name (None unless
    both were passed and substituted)."""
    if _substituted(job_id) and _substituted(task_name):
        return core.stage_key("kfp", job_id, task_name)
    return None


def _substituted(value: str) -> str:
    """``value`` unless it is a KFP placeholder left unsubstituted (then "")."""
    return "" if not value or "{{" in value else value


def run_identity(
    component: str,
    component_args: List[str],
    scheduler: str,
    cfg: Mapping[str, Any],
    parent_run_id: str = "",
    job_id: str = "",
    task_name: str = "",
) -> Tuple[str, Dict[str, str]]:
    """The tracker run's name (the KFP task's name, else the component's) and the
    orchestrator's params: the pipeline job, the task and the launcher's inputs."""
    job, task = _substituted(job_id), _substituted(task_name)
    params = {
        "kfp.job_id": job,
        "kfp.task_name": task,
        "kfp.component": component,
        "kfp.component_args": json.dumps(redact_args(list(component_args))),  # no env values
        "kfp.scheduler": scheduler,
        "kfp.cfg": json.dumps(mask_value("", dict(cfg)), sort_keys=True, default=str),
        "kfp.parent_run_id": parent_run_id,
    }
    return task or component.rpartition(":")[2] or component, {k: v for k, v in params.items() if v}


def launch(
    component: str,
    component_args: List[str],
    scheduler: str = "local_cwd",
    cfg: Optional[Dict[str, Any]] = None,
    parent_run_id: str = "",
    task_config: Optional[Mapping[str, Any]] = None,
    idempotency_key: Optional[str] = None,
    job_id: str = "",
    task_name: str = "",
    stall_timeout: Optional[float] = None,
) -> Tuple[str, StageRecord]:
    """Run the component to completion (a retried step re-attaches to its running or
    succeeded app); the app handle and what its tracker run recorded."""
    cfg = dict(cfg or {})
    kfp_run, trackers = kfp_mlflow_run()
    parent_run_id = kfp_run or parent_run_id
    run_name, run_params = run_identity(
        component, component_args, scheduler, cfg, parent_run_id, job_id, task_name
    )
    with get_runner(trackers=trackers) as runner:
        app = runner.materialize_component(component, list(component_args))
        given = set(cfg)  # the caller's keys: the runner rejects any its scheduler lacks
        apply_task_config(app, cfg, task_config)
        # the task's node selector and tolerations go where the scheduler has them (kubernetes)
        opts = runner.scheduler_run_opts(scheduler)
        cfg = {k: v for k, v in cfg.items() if k in given or k in opts}
        handle = core.submit_or_attach(
            runner,
            app,
            None,
            scheduler,
            cfg,
            idempotency_key,
            parent_run_id=parent_run_id or None,
            reattach_succeeded=True,  # a retried step whose app succeeded is done
            run_name=run_name,
            run_params=run_params,
            owner=kfp_owner(job_id, task_name),
            stall_timeout=stall_timeout,
        )
        verb = "re-attached to" if runner.reattached(handle) else "launched"
        progress: List[Any] = []  # the last report (the Metrics output gets it)
        masker = Masker(stage_secrets(runner, handle, list(component_args)))

        def print_line(role: str, k: int, line: str) -> None:
            sys.stdout.write(masker.mask(f"{role}/{k} {line}\n"))
            sys.stdout.flush()

        def on_progress(report: Any) -> None:
            progress.append(report)
            print(masker.mask(f"torchx: {core.progress_line(report)}"), flush=True)

        def on_term(signum: int, _: Any) -> None:
            print(f"torchx: step terminated (signal {signum}); cancelling {handle}", flush=True)
            core.cancel_quietly(runner, handle)
            runner.wait(handle, wait_interval=1, timeout=60)
            sys.exit(128 + signum)

        # the handler serves this wait only: the caller's is back when the wait ends
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, on_term) if main else None
        try:
            # named once the handler is in: a SIGTERM from then on cancels the app
            print(f"torchx: {verb} {handle}", flush=True)
            try:
                core.wait_or_cancel(runner, handle, 1.0, print_line, on_progress=on_progress)
            except core.StageFailed as e:
                raise RuntimeError(masker.mask(str(e))) from None
        finally:
            if main:  # None: a handler not set from Python, which cannot be put back
                signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        print(f"torchx: {handle} SUCCEEDED", flush=True)
        record = read_stage(handle, runner.trackers())
        hours = runner.resource_hours(handle)  # on the run too; here also without a tracker
        record.metrics = {**(hours.metrics() if hours else {}), **record.metrics}
        record.progress = progress[-1] if progress else None
        if record.run_url:
            print(f"torchx: tracker run {record.run_url}", flush=True)
        return handle, record
