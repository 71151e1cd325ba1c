"""``TorchXTrigger``: waits for a torchx app in the triggerer, so no worker slot is held.

The trigger's own cancellation (a triggerer stop or restart) leaves the app running for
the next triggerer. A user's action on the deferred task cancels it: ``run`` starts the
cancel as soon as Airflow's user-action cancellation reaches it, since on a loaded machine
Airflow's repeated cancel can keep ``on_kill`` from ever running. Status, logs and progress
come from the poller all triggers of the loop share (``poller.TriggerPoller``); the event
counts the lines streamed per replica, so ``execute_complete`` copies only the rest.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Dict, Optional, Tuple

from airflow.sdk.log import mask_secret
from airflow.triggers.base import BaseTrigger, TriggerEvent

# imported here, in the triggerer's loop thread, before any of the poller's threads start:
# two threads first-importing torchx.runner at once can get a partially initialized module
from torchx.pipelines import core
from torchx.pipelines.airflow.poller import TriggerPoller, Watch
from torchx.pipelines.settings import TorchXSettings

# the message Airflow's triggerer cancels a trigger's task with for a user's action on it
# (``_USER_ACTION_CANCEL_MSG``, airflow/jobs/triggerer_job_runner.py); a stop or restart: none
USER_ACTION = "__airflow_user_action__"
# replica lines logged per record (see ``_log_news``)
LINES_PER_RECORD = 1000


class TorchXTrigger(BaseTrigger):
    """Fires one event ``{"app_handle", "state", "message", "streamed"}`` when the app is
    terminal (``streamed``: ``{"role/replica": lines}`` the trigger logged)."""

    timeout_after: Optional[datetime] = None  # the triggerer sets it: the task's trigger timeout

    def __init__(
        self,
        app_handle: str,
        poll_interval: float = 5.0,
        cancel_on_kill: bool = True,
        get_logs: bool = False,
        progress_interval: Optional[float] = None,
        torchx_home: Optional[str] = None,
    ) -> None:
        super().__init__()
        self.app_handle = app_handle
        self.poll_interval = poll_interval
        self.cancel_on_kill = cancel_on_kill
        self.get_logs = get_logs
        self.progress_interval = progress_interval
        self.torchx_home = torchx_home  # the operator's Connection's (None: the environment's)
        self.streamed: Dict[str, int] = {}
        self._cancelling: Optional[threading.Thread] = None

    def serialize(self) -> Tuple[str, Dict[str, Any]]:
        return (
            "torchx.pipelines.airflow.trigger.TorchXTrigger",
            {
                "app_handle": self.app_handle,
                "poll_interval": self.poll_interval,
                "cancel_on_kill": self.cancel_on_kill,
                "get_logs": self.get_logs,
                "progress_interval": self.progress_interval,
                # only when set: a trigger without it serializes as the previous version's
                **({"torchx_home": self.torchx_home} if self.torchx_home else {}),
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        poller = TriggerPoller.of_running_loop()
        watch = poller.watch(
            Watch(
                self.app_handle,
                self.poll_interval,
                self.get_logs,
                self.progress_interval,
                self.torchx_home,
            )
        )
        try:
            while not watch.ended:
                await watch.changed.wait()
                watch.changed.clear()
                self._log_news(watch)
        except asyncio.CancelledError as e:  # triggerer stop, task killed
            if self._killed_by_user(e):
                self._start_cancel()  # before any await: see the module's docstring
            raise
        finally:
            poller.unwatch(watch)
        if watch.error is not None:
            raise watch.error
        if watch.status is None:
            yield TriggerEvent(self._event("UNKNOWN", "app not found"))
            return
        yield TriggerEvent(self._event(str(watch.status.state), core.failure_summary(watch.status)))

    def _event(self, state: str, message: str) -> Dict[str, Any]:
        return {
            "app_handle": self.app_handle,
            "state": state,
            "message": message,
            "streamed": dict(self.streamed),
        }

    def _log_news(self, watch: Watch) -> None:
        """Log what the poller found since the last call: replica lines (counted: the
        counts go into the event), warnings and progress reports. The app's secrets (from
        the poller's first look) are registered with Airflow's masker first, so the task's
        log shows the job's lines masked."""
        for secret in watch.secrets:
            mask_secret(secret)
        watch.secrets.clear()
        for start in range(0, len(watch.lines), LINES_PER_RECORD):
            # one record per batch: a log call costs the loop about 0.3 ms
            lines = watch.lines[start : start + LINES_PER_RECORD]
            for key, _ in lines:
                self.streamed[key] = self.streamed.get(key, 0) + 1
            self.log.info("%s", "\n".join(f"{key} {line}" for key, line in lines))
        for warning in watch.warnings:
            self.log.warning("%s", warning)
        for report in watch.progress:
            self.log.info("%s", core.progress_line(report))
        watch.lines.clear()
        watch.warnings.clear()
        watch.progress.clear()

    def _killed_by_user(self, error: asyncio.CancelledError) -> bool:
        """Whether ``error`` is Airflow's cancellation for a user's action on the task, by
        the rule Airflow calls ``on_kill`` by (not after the trigger's own timeout)."""
        if not self.cancel_on_kill or error.args[:1] != (USER_ACTION,):
            return False
        timeout = self.timeout_after
        if timeout is not None:
            when = timeout if timeout.tzinfo else timeout.replace(tzinfo=timezone.utc)
            return bool(when >= datetime.now(timezone.utc))
        return True

    def _start_cancel(self) -> threading.Thread:
        """Cancel the app in a daemon thread, once however often Airflow asks; the thread
        runs on when Airflow stops awaiting it."""
        if self._cancelling is None:
            self.log.info("task killed: cancelling %s", self.app_handle)
            self._cancelling = threading.Thread(
                target=self._cancel, name="torchx-trigger-cancel", daemon=True
            )
            self._cancelling.start()
        return self._cancelling

    async def on_kill(self) -> None:
        """A user killed the deferred task (mark failed or success, clear): cancel the app
        (usually already started by ``run``) and wait for it."""
        if not self.cancel_on_kill:
            return
        cancelling = self._start_cancel()
        while cancelling.is_alive():
            await asyncio.sleep(0.1)

    def _cancel(self) -> None:
        with TorchXSettings(self.torchx_home).runner() as runner:
            core.cancel_quietly(runner, self.app_handle)
