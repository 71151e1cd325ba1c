"""``TorchXTrigger``: waits for a torchx app in the triggerer, so no worker slot is held."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Dict, Optional, Tuple

from airflow.triggers.base import BaseTrigger, TriggerEvent


class TorchXTrigger(BaseTrigger):
    """Fires one event ``{"app_handle", "state", "message"}`` when the app is terminal.

    If the trigger is cancelled while the app still runs because its task was killed
    (marked failed, DAG run stopped), it cancels the app: Airflow does not call the
    operator's ``on_kill`` for a deferred task. A triggerer restart does not cancel the app
    (the task instance is still deferred then).
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
        from torchx.runner import get_runner

        with get_runner() as runner:
            return runner.wait(
                self.app_handle, wait_interval=self.poll_interval, timeout=self.poll_interval
            )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            while True:
                status = await asyncio.to_thread(self._status)
                if status is None:
                    yield TriggerEvent(
                        {
                            "app_handle": self.app_handle,
                            "state": "UNKNOWN",
                            "message": "app not found",
                        }
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
        except asyncio.CancelledError:
            if self.cancel_on_kill and self._task_was_killed():
                await asyncio.to_thread(self._cancel)
            raise

    def _task_was_killed(self) -> bool:
        """Whether the task left the deferred state (marked failed, DAG run stopped) rather
        than the triggerer stopping. Decided from the live task state, as Airflow's own
        provider triggers do; the snapshot taken when the trigger started is only a fallback
        where the triggerer's API is not reachable."""
        ti = getattr(self, "task_instance", None)
        if ti is None:
            return False
        state = _live_task_state(ti)
        if state is None:
            state = str(getattr(ti, "state", "") or "")
        return state.rsplit(".", 1)[-1].lower() != "deferred"

    def _cancel(self) -> None:
        from torchx.runner import get_runner

        with get_runner() as runner:
            runner.cancel(self.app_handle)


def _live_task_state(ti: Any) -> Optional[str]:
    """The task instance's current state from the Airflow API (None if unreachable)."""
    try:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        states = RuntimeTaskInstance.get_task_states(
            dag_id=ti.dag_id,
            map_index=getattr(ti, "map_index", None),
            task_ids=[ti.task_id],
            run_ids=[ti.run_id],
        )
    except Exception:
        return None
    by_task = states.get(ti.run_id, states) if isinstance(states, dict) else {}
    state = by_task.get(ti.task_id) if isinstance(by_task, dict) else None
    return None if state is None else str(state)
