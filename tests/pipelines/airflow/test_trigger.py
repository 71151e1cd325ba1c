"""TorchXTrigger under Airflow 3.3's own trigger runner (``TriggerRunner.run_trigger``, the
coroutine the triggerer runs each trigger in), with a real local_cwd app.

The triggerer cancels a trigger's task with its user-action message once per loop (1 s)
until the trigger ends, and Airflow's handler awaits a log call before it calls
``on_kill``. A repeat that lands in that await skips ``on_kill``: the app must be
cancelled anyway. A cancellation without the message (the triggerer stopping) must leave
the app running.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from tests.polling import poll_until

DEADLINE = 60.0


@pytest.fixture()
def app(torchx_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A running local_cwd app (no tracking); cancelled at the end if still running."""
    monkeypatch.setenv("TORCHX_TRACKERS", "")
    from torchx.runner import get_runner

    with get_runner() as runner:
        handle = runner.run_component("utils.sh", ["sleep", "600"], "local_cwd")
        state = poll_until(lambda: _state(handle), lambda s: s == "RUNNING", DEADLINE)
        assert state == "RUNNING"
        try:
            yield handle
        finally:
            runner.cancel(handle)


def _state(handle: str) -> str:
    from torchx.runner import get_runner

    with get_runner() as runner:
        status = runner.status(handle)
    return status.state.name if status is not None else ""


def _run_and_cancel(handle: str, messages: list, **trigger_args: Any) -> None:
    """Run the trigger in Airflow's ``run_trigger`` until it waits on the app, then cancel
    its task once per message, letting the loop run one step between two cancels (as a
    slow log call lets the triggerer's next loop come first)."""
    from airflow.jobs.triggerer_job_runner import TriggerRunner

    from torchx.pipelines.airflow.trigger import TorchXTrigger

    async def scenario() -> None:
        runner = TriggerRunner()
        trigger = TorchXTrigger(app_handle=handle, poll_interval=0.5, **trigger_args)
        runner.triggers[1] = {"name": "t", "events": 0, "is_watcher": False}  # type: ignore[typeddict-item]
        task = asyncio.create_task(runner.run_trigger(1, trigger))
        runner.triggers[1]["task"] = task
        await asyncio.sleep(1.0)  # the trigger waits on its app's status
        assert not task.done()
        for message in messages:
            task.cancel(message)
            await asyncio.sleep(0)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, DEADLINE)
        assert task.cancelled()

    asyncio.run(scenario())


def test_user_action_message_is_airflows() -> None:
    from airflow.jobs.triggerer_job_runner import _USER_ACTION_CANCEL_MSG

    from torchx.pipelines.airflow.trigger import USER_ACTION

    assert USER_ACTION == _USER_ACTION_CANCEL_MSG


@pytest.mark.parametrize("repeats", [1, 2])
def test_user_action_cancels_the_app_even_if_on_kill_is_skipped(app: str, repeats: int) -> None:
    from airflow.jobs.triggerer_job_runner import _USER_ACTION_CANCEL_MSG

    _run_and_cancel(app, [_USER_ACTION_CANCEL_MSG] * repeats)
    state = poll_until(lambda: _state(app), lambda s: s == "CANCELLED", DEADLINE, 0.2)
    assert state == "CANCELLED"


def test_triggerer_stop_leaves_the_app_running(app: str) -> None:
    _run_and_cancel(app, [None, None])  # how the triggerer's shutdown cancels its triggers
    # the trigger's threads (status checks, a cancel if there were one) have ended
    left = poll_until(_trigger_threads, lambda names: not names, DEADLINE, 0.1)
    assert not left
    assert _state(app) == "RUNNING"


def _trigger_threads() -> list:
    return [t.name for t in threading.enumerate() if t.name.startswith("torchx-trigger")]


class Runners:
    """Every Runner the trigger module makes, and which of them were closed."""

    def __init__(self) -> None:
        self.made: List[Any] = []
        self.closed: List[Any] = []

    def open(self) -> List[Any]:
        return [r for r in self.made if not any(r is c for c in self.closed)]


@pytest.fixture()
def runners(monkeypatch: pytest.MonkeyPatch) -> Runners:
    from torchx.pipelines.airflow import poller

    seen = Runners()
    real = poller.get_runner

    def get_runner(*args: Any, **kwargs: Any) -> Any:
        runner = real(*args, **kwargs)
        close = runner.close

        def closing() -> None:
            seen.closed.append(runner)
            close()

        runner.close = closing  # type: ignore[method-assign]
        seen.made.append(runner)
        return runner

    monkeypatch.setattr(poller, "get_runner", get_runner)
    return seen


def test_a_stopped_trigger_stops_reading_logs_without_a_line_and_closes_its_runners(
    app: str, runners: Runners
) -> None:
    """The app writes no line: the trigger's log reader still ends once the triggerer
    stops the trigger, and every Runner the trigger made is closed."""
    _run_and_cancel(app, [None], get_logs=True, progress_interval=0.5)
    left = poll_until(_trigger_threads, lambda names: not names, 10, 0.1)
    assert not left  # before: the log reader waited for the app's next line
    assert runners.made  # the shared poller's (status checks, logs, progress)
    assert poll_until(runners.open, lambda still: not still, 10, 0.1) == []
    assert _state(app) == "RUNNING"


def test_a_trigger_whose_app_ends_closes_its_runners(
    torchx_env: Path, monkeypatch: pytest.MonkeyPatch, runners: Runners
) -> None:
    from torchx.pipelines.airflow.trigger import TorchXTrigger
    from torchx.runner import get_runner

    monkeypatch.setenv("TORCHX_TRACKERS", "")
    with get_runner() as runner:
        handle = runner.run_component(
            "utils.sh", ["sh", "-c", "echo one; echo two; sleep 1"], "local_cwd"
        )
    trigger = TorchXTrigger(handle, poll_interval=0.5, get_logs=True, progress_interval=0.5)

    async def events() -> List[Dict[str, Any]]:
        return [e.payload async for e in trigger.run()]

    [event] = asyncio.run(events())
    assert event["state"] == "SUCCEEDED" and sum(event["streamed"].values()) == 2, event
    assert runners.made
    assert poll_until(runners.open, lambda still: not still, 10, 0.1) == []
