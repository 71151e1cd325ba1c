"""Stall detection by whoever waits on an app (``Runner.wait``, so the CLI, the pipeline
stages and the Airflow trigger alike), for schedulers without a supervisor of their own.

An app submitted with ``stall_timeout=S`` stalls when neither a log line nor a progress
report came for S seconds. The scheduler tells when the last one came
(``Scheduler.last_activity``, epoch seconds measured by the job's side, so a waiter that
starts late, or a fresh one each poll as the Airflow trigger has, sees the same thing).
The waiter then has the scheduler stop the app with that reason, kept with the job
(``Scheduler.stop_stalled``), so every later reader sees it FAILED ``stalled: ...``.

Never on doubt: an app that is not RUNNING (a queued gang is not stalled), a scheduler
that cannot tell (``last_activity`` is None; ``local_cwd``, whose supervisor enforces
stalls itself) or an app without a stall timeout is left alone.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from torchx.runtime.progress import read_progress
from torchx.schedulers.api import Scheduler, app_stall_timeout, stall_reason
from torchx.specs.api import AppDef

logger = logging.getLogger(__name__)


def stall_timeout_of(app: Optional[AppDef]) -> Optional[float]:
    """The stall timeout stored with an app (None: no stall detection, or unreadable)."""
    try:
        return app_stall_timeout(app) if app is not None else None
    except ValueError:
        return None


def stop_if_stalled(
    sched: Scheduler,
    app_id: str,
    timeout_of: Callable[[], Optional[float]],
    now: Optional[float] = None,
) -> Optional[str]:
    """Cancel a RUNNING app that stalled (the caller checked it runs); returns the reason,
    or None if it did not stall. ``timeout_of`` is asked only when the scheduler can tell
    the app's last activity (it may cost a ``describe``)."""
    last = sched.last_activity(app_id)
    if last is None:
        return None
    timeout = timeout_of()
    if timeout is None:
        return None
    if (time.time() if now is None else now) - last < timeout:
        return None
    report = read_progress(sched.progress_path(app_id))
    reason = stall_reason(timeout, report.step if report else None)
    logger.warning("%s: %s; cancelling it", app_id, reason)
    sched.stop_stalled(app_id, reason)
    return reason
