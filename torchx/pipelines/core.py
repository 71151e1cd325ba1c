"""What every orchestrator adapter does with a torchx stage, written once: open the
pipeline's tracker run, submit or re-attach by idempotency key, follow logs and progress
while waiting, cancel only when the wait itself is cancelled (an ordinary exception leaves
the app for the retry), raise ``StageFailed``, link the app and its run, and close the
pipeline run with its stages' resource-hours.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Type, Union

from torchx.pipelines.owner import Owner
from torchx.runner.api import Runner
from torchx.runner.resource_hours import ResourceHours
from torchx.runtime.progress import Progress
from torchx.specs.api import AppDef, AppState, AppStatus
from torchx.specs.errors import backend_errors
from torchx.trackers.api import build_trackers

logger = logging.getLogger(__name__)

Component = Union[str, AppDef]
ComponentArgs = Union[List[str], Dict[str, Any], None]
Emit = Callable[[str, int, str], None]
Log = Union[logging.Logger, logging.LoggerAdapter]  # orchestrators hand out adapters
OnProgress = Callable[[Progress], None]

# how often a stage reads its job's progress report into the orchestrator (seconds)
PROGRESS_INTERVAL = 30.0

# What interrupts a wait because the stage itself is cancelled (a cancelled asyncio task,
# Ctrl-C, KFP's SIGTERM handler's exit); anything else is no reason to throw away the work.
CANCELLATIONS: Tuple[Type[BaseException], ...] = (
    asyncio.CancelledError,
    KeyboardInterrupt,
    SystemExit,
)

# how a pipeline run ends, in MLflow's run-status words
FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"


class StageFailed(Exception):
    """A torchx stage did not succeed; ``status`` has the replicas and the worker's error."""

    def __init__(self, handle: str, status: Optional[AppStatus]) -> None:
        summary = failure_summary(status) if status else "is not known to its scheduler any more"
        super().__init__(f"torchx app {handle} {summary}")
        self.handle = handle
        self.status = status


def failure_summary(status: AppStatus) -> str:
    """``status.error_summary()`` naming the replica that failed first (by its error file's
    timestamp, else in role order), when one did."""
    failed: List[Tuple[float, int, str]] = []
    for role in status.roles:
        for r in role.replicas:
            if r.state == AppState.FAILED:
                failed.append(
                    (_error_time(r.structured_error_msg), len(failed), f"{role.role}/{r.id}")
                )
    summary = status.error_summary()
    return f"{summary} [first failed: {min(failed)[2]}]" if failed else summary


def _error_time(structured: str) -> float:
    try:
        data = json.loads(structured)
        message = data.get("message", {})
        extra = message.get("extraInfo", {}) if isinstance(message, dict) else {}
        return float(extra.get("timestamp", data.get("timestamp")))
    except (ValueError, TypeError, AttributeError):  # no error file, or not torchelastic's
        return float("inf")


def stage_key(*parts: object) -> str:
    """A stable key from the orchestrator's identity of a stage (same parts, same key)."""
    return "/".join(str(p) for p in parts)


def content_key(
    component: Component, component_args: ComponentArgs, scheduler: str, cfg: Mapping[str, Any]
) -> str:
    """A stable digest of what a stage runs: two different stages never share it."""
    if isinstance(component, AppDef):
        from torchx.specs.serialize import appdef_to_dict

        what: Any = appdef_to_dict(component)
    else:
        what = [component, component_args]
    text = json.dumps([what, scheduler, dict(cfg)], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def open_pipeline_run(
    run_id: str, trackers: Mapping[str, Optional[str]], **metadata: object
) -> str:
    """Open (idempotently) the tracker run that groups a pipeline run's stages."""
    for tracker in build_trackers(trackers):
        tracker.add_metadata(run_id, kind="pipeline", **metadata)
    return run_id


def close_pipeline_run(
    run_id: str, trackers: Mapping[str, Optional[str]], state: str
) -> Optional[ResourceHours]:
    """End the pipeline's tracker run, then log (and return) its stages' summed
    resource-hours. The run ends first: a killed slow callback (Airflow's dag-processor
    kills them) leaves the sums missing, never the run RUNNING for good."""
    if not trackers:
        return None
    from torchx.runner.resource_hours import record_pipeline_hours

    try:
        for tracker in build_trackers(trackers):
            tracker.end_run(run_id, state)
    except backend_errors() as e:  # closing a run is never worth failing the pipeline
        logger.warning("could not end pipeline run %s as %s: %s", run_id, state, e)
    return record_pipeline_hours(run_id, trackers)


def submit_or_attach(
    runner: Runner,
    component: Component,
    component_args: ComponentArgs,
    scheduler: str,
    cfg: Optional[Mapping[str, Any]],
    key: Optional[str],
    parent_run_id: Optional[str] = None,
    reattach_succeeded: bool = False,
    run_name: Optional[str] = None,
    run_params: Optional[Mapping[str, object]] = None,
    owner: Optional[Owner] = None,
    stall_timeout: Optional[float] = None,
) -> str:
    """Re-attach to the live app submitted with ``key``, else submit the stage with it
    (``run_name`` and ``run_params``: the job's tracker run's, from the orchestrator); the
    app's handle (``runner.reattached(handle)`` tells which)."""
    cfg = dict(cfg or {})
    options: Dict[str, Any] = {
        "parent_run_id": parent_run_id,
        "idempotency_key": key,
        "reattach_succeeded": reattach_succeeded,
        "run_name": run_name,
        "run_params": run_params,
        "owner": owner.to_metadata() if owner is not None else None,
        "stall_timeout": stall_timeout,
    }
    if isinstance(component, AppDef):
        return runner.run(component, scheduler, cfg, **options)
    args = component_args if component_args is not None else []
    return runner.run_component(component, args, scheduler, cfg, **options)


def follow_logs(runner: Runner, handle: str, emit: Emit, tail: bool = True) -> None:
    """Call ``emit(role, replica, line)`` for each line (without its newline) as it is
    written, from a thread per replica, one call at a time; reader errors are logged."""
    from torchx.runner.logs import each_replica, replicas_of

    lock = threading.Lock()

    def copy(role: str, k: int, _: int) -> None:
        for line in runner.log_lines(handle, role, k, should_tail=tail):
            with lock:
                emit(role, k, line.rstrip("\n"))

    for error in each_replica(replicas_of(runner, handle), copy):
        logger.warning("could not read logs of %s: %s", handle, error)


class ProgressFollower:
    """Hands the job's progress report to ``on_progress`` at most every ``interval``
    seconds, and only when it changed: one log or artifact entry per real change.
    ``poll()`` serves a caller's loop; ``start()`` / ``stop()`` a thread beside a wait."""

    def __init__(
        self,
        runner: Runner,
        handle: str,
        on_progress: OnProgress,
        interval: float = PROGRESS_INTERVAL,
    ) -> None:
        self.runner = runner
        self.handle = handle
        self.on_progress = on_progress
        self.interval = interval
        self.last: Optional[Progress] = None
        self._next = 0.0  # monotonic time of the next read
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def poll(self, force: bool = False) -> Optional[Progress]:
        """Read the report if ``interval`` passed (or ``force``); the new one if it changed."""
        with self._lock:
            now = time.monotonic()
            if not force and now < self._next:
                return None
            self._next = now + self.interval
            try:
                report = self.runner.progress(self.handle)
            except backend_errors() as e:  # no report this time
                logger.warning("could not read the progress of %s: %s", self.handle, e)
                return None
            if report is None or _same(report, self.last):
                return None
            self.last = report
        try:
            self.on_progress(report)
        except Exception as e:  # an orchestrator's API raises its own errors: never fatal
            logger.warning("could not publish the progress of %s: %s", self.handle, e)
        return report

    def start(self) -> ProgressFollower:
        def loop() -> None:
            while not self._stop.wait(min(self.interval, 1.0)):
                self.poll()

        # in the caller's context: an orchestrator finds its run there (Prefect's artifacts)
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(loop,), name="torchx-progress", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, final: bool = True) -> None:
        """Stop the thread; with ``final``, read the last report once more (the final step)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if final:
            self.poll(force=True)


def _same(a: Progress, b: Optional[Progress]) -> bool:
    return b is not None and (a.step, a.total, a.metrics) == (b.step, b.total, b.metrics)


def progress_line(report: Progress) -> str:
    """``progress: step 45/100, 2 steps/s, ETA 27s, last report 0.4s ago, loss=0.31``."""
    metrics = ", ".join(f"{k}={v:g}" for k, v in sorted(report.metrics.items()))
    return f"progress: {report.format()}" + (f", {metrics}" if metrics else "")


def wait_or_cancel(
    runner: Runner,
    handle: str,
    poll_interval: float = 1.0,
    emit: Optional[Emit] = None,
    cancel_on: Tuple[Type[BaseException], ...] = CANCELLATIONS,
    log: Optional[Log] = None,
    on_progress: Optional[OnProgress] = None,
    progress_interval: Optional[float] = PROGRESS_INTERVAL,
) -> AppStatus:
    """Wait for the app (logs into ``emit``, progress into ``on_progress`` unless
    ``progress_interval`` is None); the final status if it SUCCEEDED, else ``StageFailed``.
    Only ``cancel_on`` cancels the app: any other exception leaves it running, for the
    task's retry to re-attach to."""
    follower = None
    if on_progress is not None and progress_interval is not None:
        interval = progress_interval or PROGRESS_INTERVAL  # 0: the default, not a busy loop
        follower = ProgressFollower(runner, handle, on_progress, interval).start()
    try:
        if emit is not None:
            follow_logs(runner, handle, emit)
        status = runner.wait(handle, wait_interval=poll_interval)
    except cancel_on as e:
        (log or logger).warning("wait cancelled (%s): cancelling %s", type(e).__name__, handle)
        if follower is not None:
            follower.stop(final=False)
        cancel_quietly(runner, handle, log)
        raise
    if follower is not None:
        follower.stop()
    return check_succeeded(handle, status)


def check_succeeded(handle: str, status: Optional[AppStatus]) -> AppStatus:
    if status is None or status.state != AppState.SUCCEEDED:
        raise StageFailed(handle, status)
    return status


def cancel_quietly(runner: Runner, handle: str, log: Optional[Log] = None) -> None:
    """Cancel the app; an app already gone or unreachable is logged (to ``log``), not raised."""
    try:
        runner.cancel(handle)
    except backend_errors() as e:  # the reaper can still cancel it
        (log or logger).warning("could not cancel %s: %s", handle, e)


def tracker_run_link(handle: str, trackers: Mapping[str, Optional[str]]) -> Optional[str]:
    """The URL of the app's tracker run (None without trackers, a UI, or a run)."""
    for tracker in build_trackers(trackers):
        try:
            url = tracker.run_url(handle)
        except backend_errors() as e:  # a link is never worth failing a stage
            logger.warning("could not link the tracker run of %s: %s", handle, e)
            continue
        if url:
            return url
    return None


def final_state(succeeded: bool, cancelled: bool = False) -> str:
    """The pipeline run's end state from the orchestrator's outcome."""
    return KILLED if cancelled else (FINISHED if succeeded else FAILED)
