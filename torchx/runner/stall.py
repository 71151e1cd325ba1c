"""Stall detection by whoever waits on an app (``Runner.wait``, so the CLI, the pipeline
stages and the Airflow trigger alike), for schedulers without a supervisor of their own.

An app submitted with ``stall_timeout=S`` stalls when neither a log line nor a progress
report came for S seconds. The scheduler tells when the last one came
(``Scheduler.last_activity``, epoch seconds from what the job's side measured, so a waiter that
starts late, or a fresh one each poll as the Airflow trigger has, sees the same thing);
a progress report sent to the job's tracker run (``Runner.progress``) counts as well.
The waiter then has the scheduler stop the app with that reason, kept with the job
(``Scheduler.stop_stalled``), so every later reader sees it FAILED ``stalled: ...``.

Never on doubt: an app that is not RUNNING (a queued gang is not stalled), a scheduler
that cannot tell (``last_activity`` is None; ``local_cwd``, whose supervisor enforces
stalls itself) or an app without a stall timeout is left alone.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Optional

from torchx.schedulers.api import Scheduler, app_stall_timeout, stall_reason
from torchx.specs.api import AppDef, AppState

if TYPE_CHECKING:
    from torchx.runner.api import Runner

logger = logging.getLogger(__name__)


def stall_timeout_of(app: Optional[AppDef]) -> Optional[float]:
    """The stall timeout stored with an app (None: no stall detection, or unreadable)."""
    try:
        return app_stall_timeout(app) if app is not None else None
    except ValueError:
        return None


def stop_if_stalled(
    runner: Runner, sched: Scheduler, app_id: str, handle: str, state: AppState
) -> Optional[str]:
    """Stop the app ``app_id`` of ``sched`` (``handle`` in ``runner``) if it is RUNNING (in
    ``state``) and stalled; returns the reason, or None
    if it did not stall. The app's stall timeout (maybe a ``describe``) and its last
    progress report (maybe a tracker call) are asked only when its output went quiet.

    Never raises: a hook that fails (the scheduler's or the tracker's API down) is doubt,
    so the app runs on and its waiter keeps waiting (one warning)."""
    if state != AppState.RUNNING:
        return None
    try:
        return _stop_if_stalled(runner, sched, app_id, handle)
    except Exception as e:  # any scheduler's or tracker's failure: doubt, never a stop
        logger.warning("%s: cannot tell whether it stalled, leaving it running: %s", handle, e)
        return None


def _stop_if_stalled(runner: Runner, sched: Scheduler, app_id: str, handle: str) -> Optional[str]:
    last = sched.last_activity(app_id)
    if last is None:
        return None
    timeout = stall_timeout_of(runner.describe(handle))
    if timeout is None or time.time() - last < timeout:
        return None
    # a report through the tracker (no progress file on this scheduler) is activity too
    report = runner.progress(handle)
    if report is not None and time.time() - max(last, report.time) < timeout:
        return None
    reason = stall_reason(timeout, report.step if report else None)
    logger.warning("%s: %s; stopping it", handle, reason)
    sched.stop_stalled(app_id, reason)
    return reason
