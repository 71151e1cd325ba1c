"""``TorchXTrigger``: waits for a torchx app in the triggerer, so no worker slot is held.

Lifecycle, as Airflow 3.3 defines it for triggers:

- the trigger's cancellation (``CancelledError``) is *not* a reason to cancel the app: the
  triggerer cancels every trigger when it stops or restarts, and the task is still deferred
  then; the next triggerer's trigger re-attaches to the app;
- ``on_kill`` cancels the app: Airflow calls it when a user acts on the deferred task (mark
  failed, mark success, clear);
- status checks run in a daemon thread, so a triggerer that stops never waits for one.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator, Callable, Dict, Optional, Tuple, TypeVar

from airflow.triggers.base import BaseTrigger, TriggerEvent

T = TypeVar("T")


class TorchXTrigger(BaseTrigger):
    """Fires one event ``{"app_handle", "state", "message"}`` when the app is terminal.

    A user's kill of the deferred task (mark failed or success, clear) cancels the app
    (``on_kill``, when ``cancel_on_kill``); a triggerer restart leaves it running.
    """

    def __init__(
        self, app_handle: str, poll_interval: float = 5.0, cancel_on_kill: bool = True
    ) -> None:
        super().__init__()
        self.app_handle = app_handle
        self.poll_interval = poll_interval
        self.cancel_on_kill = cancel_on_kill

    def serialize(self) -> Tuple[str, Dict[str, Any]]:
        return (
            "torchx.pipelines.airflow.trigger.TorchXTrigger",
            {
                "app_handle": self.app_handle,
                "poll_interval": self.poll_interval,
                "cancel_on_kill": self.cancel_on_kill,
            },
        )

    def _status(self) -> Any:
        """The app's status once terminal, or after ``poll_interval`` (a local app's end
        wakes this at once)."""
        from torchx.runner import get_runner

        with get_runner() as runner:
            return runner.wait(
                self.app_handle, wait_interval=self.poll_interval, timeout=self.poll_interval
            )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            status = await off_loop(self._status)
            if status is None:
                yield TriggerEvent(
                    {"app_handle": self.app_handle, "state": "UNKNOWN", "message": "app not found"}
                )
                return
            if status.is_terminal():
                yield TriggerEvent(
                    {
                        "app_handle": self.app_handle,
                        "state": str(status.state),
                        "message": status.error_summary(),
                    }
                )
                return

    async def on_kill(self) -> None:
        """A user killed the deferred task (mark failed or success, clear): cancel the app."""
        if not self.cancel_on_kill:
            return
        self.log.info("task killed: cancelling %s", self.app_handle)
        await off_loop(self._cancel)

    def _cancel(self) -> None:
        from torchx.pipelines import core
        from torchx.runner import get_runner

        with get_runner() as runner:
            core.cancel_quietly(runner, self.app_handle)


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
