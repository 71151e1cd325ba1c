"""``TorchXTrigger``: waits for a torchx app in the triggerer, so no worker slot is held.

Lifecycle, as Airflow 3.3 defines it for triggers:

- the trigger's cancellation (``CancelledError``) is *not* a reason to cancel the app: the
  triggerer cancels every trigger when it stops or restarts, and the task is still deferred
  then; the next triggerer's trigger re-attaches to the app;
- a user's action on the deferred task (mark failed, mark success, clear) cancels the app.
  Airflow cancels the trigger's task with its user-action message, then calls ``on_kill``;
  but its handler awaits a log call before ``on_kill``, and the triggerer repeats the
  cancel every loop (1 s) until the trigger ends, so on a loaded machine the repeat can
  land in that await and ``on_kill`` never runs. So the trigger starts the cancel itself
  the moment the user-action cancellation reaches it (no await before), and ``on_kill``
  joins that one cancel (or starts it, if the cancellation reached Airflow first);
- status checks run in a daemon thread, so a triggerer that stops never waits for one.

Live logs: while the task is deferred, the trigger streams the job's new log lines
(``role/replica`` prefixed) into its ``self.log``, which Airflow 3 writes to the task
instance's log (one ``.trigger.<job>.log`` file per triggerer, shown with the task's
log), and a ``progress: ...`` line when the job's progress report changed, at most every
``progress_interval`` seconds. The event carries how many lines of each replica were
streamed, so ``execute_complete`` copies only the rest. A restarted triggerer's trigger
streams each replica from its first line again (a trigger's kwargs are fixed when the task
defers, so there is nowhere to keep an offset): after a triggerer restart the lines
before it appear twice, none is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Tuple, TypeVar

from airflow.triggers.base import BaseTrigger, TriggerEvent

# imported here, in the triggerer's loop thread, before any of the trigger's threads start:
# two threads first-importing torchx.runner at once can get a partially initialized module
from torchx.pipelines import core
from torchx.runner.api import get_runner
from torchx.runner.logs import tail_app_logs

T = TypeVar("T")

# the message Airflow's triggerer cancels a trigger's task with when a user acted on the task
# (``_USER_ACTION_CANCEL_MSG`` in airflow/jobs/triggerer_job_runner.py); its own stop or
# restart cancels with none
USER_ACTION = "__airflow_user_action__"


class TorchXTrigger(BaseTrigger):
    """Fires one event ``{"app_handle", "state", "message", "streamed"}`` when the app is
    terminal (``streamed``: ``{"role/replica": lines}`` the trigger logged).

    A user's kill of the deferred task (mark failed or success, clear) cancels the app
    (``on_kill``, when ``cancel_on_kill``); a triggerer restart leaves it running.
    """

    def __init__(
        self,
        app_handle: str,
        poll_interval: float = 5.0,
        cancel_on_kill: bool = True,
        get_logs: bool = False,
        progress_interval: Optional[float] = None,
    ) -> None:
        super().__init__()
        self.app_handle = app_handle
        self.poll_interval = poll_interval
        self.cancel_on_kill = cancel_on_kill
        self.get_logs = get_logs
        self.progress_interval = progress_interval
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
            },
        )

    def _status(self) -> Any:
        """The app's status once terminal, or after ``poll_interval`` (a local app's end
        wakes this at once)."""
        with get_runner() as runner:
            return runner.wait(
                self.app_handle, wait_interval=self.poll_interval, timeout=self.poll_interval
            )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # lines come from reader threads through this queue and are logged on the loop: the
        # triggerer routes a trigger's log by context variables, which threads do not have
        lines: asyncio.Queue[Tuple[str, str]] = asyncio.Queue()
        stop = threading.Event()
        readers = self._start_readers(asyncio.get_running_loop(), lines, stop)
        with get_runner() as runner:  # the progress follower's, closed before the event
            follower = self._follower(runner)
            try:
                status = await self._wait(lines, follower)
            except BaseException as e:  # cancelled (triggerer stop, task killed): readers end
                stop.set()
                if self._killed_by_user(e):
                    self._start_cancel()  # before any await: see the module's docstring
                raise
            if status is not None and readers is not None:
                # the app ended: its readers reach the end of its logs; log what is left
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._drain_until(readers, lines), 30)
            self._log_lines(lines)
            if follower is not None and status is not None:
                await self._progress(follower, final=True)  # the last report
        if status is None:
            yield TriggerEvent(self._event("UNKNOWN", "app not found"))
            return
        yield TriggerEvent(self._event(str(status.state), core.failure_summary(status)))

    def _event(self, state: str, message: str) -> Dict[str, Any]:
        return {
            "app_handle": self.app_handle,
            "state": state,
            "message": message,
            "streamed": dict(self.streamed),
        }

    async def _wait(self, lines: asyncio.Queue[Tuple[str, str]], follower: Any) -> Any:
        """The terminal status (None: app not found), logging lines and progress meanwhile."""
        status_check = asyncio.ensure_future(off_loop(self._status))
        try:
            while True:
                getter = asyncio.ensure_future(lines.get())
                done, _ = await asyncio.wait(
                    {status_check, getter}, return_when=asyncio.FIRST_COMPLETED
                )
                if getter in done:
                    self._write(getter.result())
                else:
                    getter.cancel()
                self._log_lines(lines)
                if follower is not None and follower.due():
                    await self._progress(follower)
                if status_check in done:
                    status = status_check.result()
                    if status is None or status.is_terminal():
                        return status
                    status_check = asyncio.ensure_future(off_loop(self._status))
        finally:
            status_check.cancel()

    async def _progress(self, follower: Any, final: bool = False) -> None:
        """Log the job's progress report if it changed."""
        report = await off_loop(lambda: follower.poll(force=final))
        if report is not None:
            self.log.info("%s", core.progress_line(report))

    def _follower(self, runner: Any) -> Any:
        if self.progress_interval is None:
            return None

        # the follower returns the report; it is logged here, on the loop
        return core.ProgressFollower(
            runner, self.app_handle, lambda _: None, self.progress_interval
        )

    def _log_lines(self, lines: asyncio.Queue[Tuple[str, str]]) -> None:
        while not lines.empty():
            self._write(lines.get_nowait())

    def _write(self, item: Tuple[str, str]) -> None:
        """Log one replica line and count it (the counts go into the event)."""
        key, line = item
        self.streamed[key] = self.streamed.get(key, 0) + 1
        self.log.info("%s %s", key, line)

    async def _drain_until(
        self, readers: threading.Thread, lines: asyncio.Queue[Tuple[str, str]]
    ) -> None:
        while readers.is_alive():
            await asyncio.sleep(0.2)
            self._log_lines(lines)

    def _start_readers(
        self,
        loop: asyncio.AbstractEventLoop,
        lines: asyncio.Queue[Tuple[str, str]],
        stop: threading.Event,
    ) -> Optional[threading.Thread]:
        """Follow every replica's log in a daemon thread (None without ``get_logs``); each
        line goes to ``lines`` and is counted in ``streamed``. A stopped trigger's thread
        ends within a second (each replica's reader at its next line, or the app's end)."""
        if not self.get_logs:
            return None

        def emit(role: str, k: int, line: str) -> None:
            if stop.is_set():
                raise _Stopped()
            loop.call_soon_threadsafe(lines.put_nowait, (f"{role}/{k}", line))

        def follow() -> None:
            errors: List[BaseException] = []
            try:
                with get_runner() as runner:
                    errors = tail_app_logs(runner, self.app_handle, emit, True, stop)
            except Exception as e:
                errors = [e]
            for error in errors:  # (a thread's log goes to the triggerer's own log)
                if not isinstance(error, (_Stopped, RuntimeError)):
                    self.log.warning("could not read logs of %s: %s", self.app_handle, error)

        thread = threading.Thread(target=follow, name="torchx-trigger-logs", daemon=True)
        thread.start()
        return thread

    def _killed_by_user(self, error: BaseException) -> bool:
        """Whether ``error`` is Airflow's cancellation for a user's action on the task, by
        the rule Airflow calls ``on_kill`` by (not after the trigger's own timeout)."""
        if not self.cancel_on_kill or not isinstance(error, asyncio.CancelledError):
            return False
        if error.args[:1] != (USER_ACTION,):
            return False
        timeout = getattr(self, "timeout_after", None)
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
        with get_runner() as runner:
            core.cancel_quietly(runner, self.app_handle)


class _Stopped(Exception):
    """Ends a stopped trigger's log readers."""


async def off_loop(fn: Callable[[], T]) -> T:
    """``fn()`` in a daemon thread: unlike ``asyncio.to_thread``, a triggerer that stops
    (its loop closes, its process exits) never waits for a blocking scheduler call."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: Optional[BaseException]) -> None:
        if future.done():  # the awaiting trigger was cancelled
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def work() -> None:
        try:
            result, error = fn(), None
        except BaseException as e:  # noqa: B036 - handed to the awaiting coroutine
            result, error = None, e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed: nobody waits any more
            pass

    threading.Thread(target=work, name="torchx-trigger", daemon=True).start()
    return await future
