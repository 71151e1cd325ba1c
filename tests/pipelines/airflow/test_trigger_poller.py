"""TorchXTriggers sharing their triggerer's poller, with real local_cwd apps: one scheduler
list per round for all of them, a fixed pool of threads, and a trigger deferred by the
previous version (its classpath and kwargs as Airflow's database holds them) still runs
to its event."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tests.polling import poll_until

DEADLINE = 60.0


def _launch(script: str) -> str:
    from torchx.runner import get_runner

    with get_runner() as runner:
        return runner.run_component("utils.sh", ["sh", "-c", script], "local_cwd")


def _trigger_threads() -> List[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("torchx-trigger")]


def test_a_trigger_serialized_by_the_previous_version_runs_to_its_event(
    torchx_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow._shared.module_loading import import_string

    monkeypatch.setenv("TORCHX_TRACKERS", "")
    handle = _launch("echo one; echo two >&2; sleep 1; echo three")
    # exactly what TorchXTrigger.serialize() gave before the shared poller
    classpath = "torchx.pipelines.airflow.trigger.TorchXTrigger"
    kwargs: Dict[str, Any] = {
        "app_handle": handle,
        "poll_interval": 0.5,
        "cancel_on_kill": True,
        "get_logs": True,
        "progress_interval": None,
    }
    trigger = import_string(classpath)(**kwargs)  # how the triggerer inflates it
    assert trigger.serialize() == (classpath, kwargs)

    async def events() -> List[Dict[str, Any]]:
        return [e.payload async for e in trigger.run()]

    [event] = asyncio.run(asyncio.wait_for(events(), DEADLINE))
    assert set(event) == {"app_handle", "state", "message", "streamed"}, event
    assert event["app_handle"] == handle and event["state"] == "SUCCEEDED", event
    assert event["streamed"] == {"sh/0": 3}, event


def test_triggers_of_one_loop_share_one_list_per_round_and_a_fixed_pool(
    torchx_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten deferred stages, each printing a line then ending (one of them failing): each
    gets its own event with its own lines; the local scheduler is listed once per round,
    not once per trigger; the poller's threads stay at its pool size and end with it."""
    from airflow.jobs.triggerer_job_runner import TriggerRunner

    from torchx.pipelines.airflow import poller
    from torchx.pipelines.airflow.trigger import TorchXTrigger
    from torchx.schedulers.local.scheduler import LocalScheduler

    monkeypatch.setenv("TORCHX_TRACKERS", "")
    lists: List[int] = []
    real_list = LocalScheduler.list

    def counted_list(self: LocalScheduler) -> Any:
        lists.append(1)
        return real_list(self)

    monkeypatch.setattr(LocalScheduler, "list", counted_list)
    n = 10
    handles = [_launch(f"echo stage {i}; sleep 2; exit {3 if i == 0 else 0}") for i in range(n)]
    peak: List[int] = [0]

    async def scenario() -> Dict[str, Dict[str, Any]]:
        runner = TriggerRunner()
        tasks = {}
        for i, handle in enumerate(handles):
            trigger = TorchXTrigger(handle, poll_interval=0.5, get_logs=True)
            runner.triggers[i] = {"name": f"t{i}", "events": 0, "is_watcher": False}  # type: ignore[typeddict-item]
            tasks[handle] = asyncio.create_task(runner.run_trigger(i, trigger))
            runner.triggers[i]["task"] = tasks[handle]
        pending = set(tasks.values())
        while pending:
            _, pending = await asyncio.wait(pending, timeout=0.1)
            peak[0] = max(peak[0], len(_trigger_threads()))
        the_poller = poller.TriggerPoller.of_running_loop()
        assert the_poller.rounds >= 1
        assert len(lists) == the_poller.rounds, (len(lists), the_poller.rounds)
        return {e.trigger_id: e.event.payload for e in runner.events}

    by_id = asyncio.run(asyncio.wait_for(scenario(), DEADLINE))
    events = {by_id[i]["app_handle"]: by_id[i] for i in range(n)}
    assert events[handles[0]]["state"] == "FAILED", events[handles[0]]
    for i, handle in enumerate(handles):
        assert events[handle]["streamed"] == {"sh/0": 1}, events[handle]
        if i:
            assert events[handle]["state"] == "SUCCEEDED", events[handle]
    assert 0 < peak[0] <= poller.POOL_SIZE, peak
    assert poll_until(_trigger_threads, lambda names: not names, 10, 0.1) == []


def test_a_quiet_log_is_not_read_again(torchx_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica that printed once and then sleeps: its log file is stat'ed each round but
    read only when it grew (first look), and once more at the end."""
    from torchx.pipelines.airflow import poller
    from torchx.pipelines.airflow.trigger import TorchXTrigger
    from torchx.schedulers.local.scheduler import LocalScheduler

    monkeypatch.setenv("TORCHX_TRACKERS", "")
    reads: List[int] = []
    real_log_iter = LocalScheduler.log_iter

    def counted_log_iter(self: LocalScheduler, *args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        return real_log_iter(self, *args, **kwargs)

    monkeypatch.setattr(LocalScheduler, "log_iter", counted_log_iter)
    handle = _launch("echo one; sleep 4; echo two")
    trigger = TorchXTrigger(handle, poll_interval=0.5, get_logs=True)

    async def scenario() -> Any:
        [event] = [e.payload async for e in trigger.run()]
        return event, poller.TriggerPoller.of_running_loop().rounds

    event, rounds = asyncio.run(asyncio.wait_for(scenario(), DEADLINE))
    assert event["state"] == "SUCCEEDED" and event["streamed"] == {"sh/0": 2}, event
    assert rounds >= 5, rounds  # the app slept through several rounds
    assert len(reads) <= 3, (len(reads), rounds)  # "one", "two" and the end, not every round


def test_a_trigger_given_the_connections_torchx_home_finds_its_app_there(
    torchx_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator hands its Connection's ``torchx_home`` to the trigger: the triggerer's
    own environment (here another ``TORCHX_HOME``) does not decide where the app is."""
    from torchx.pipelines.airflow.trigger import TorchXTrigger
    from torchx.runner import get_runner

    monkeypatch.setenv("TORCHX_TRACKERS", "")
    home = torchx_env / "connection-home"
    with get_runner(torchx_home=str(home)) as runner:
        handle = runner.run_component("utils.sh", ["sh", "-c", "echo from-home"], "local_cwd")
    monkeypatch.setenv("TORCHX_HOME", str(torchx_env / "elsewhere"))
    trigger = TorchXTrigger(handle, poll_interval=0.5, get_logs=True, torchx_home=str(home))
    assert trigger.serialize()[1]["torchx_home"] == str(home)

    async def events() -> List[Dict[str, Any]]:
        return [e.payload async for e in trigger.run()]

    [event] = asyncio.run(asyncio.wait_for(events(), DEADLINE))
    assert event["state"] == "SUCCEEDED" and event["streamed"] == {"sh/0": 1}, event


def test_a_round_wakes_its_triggers_in_batches_letting_the_loop_run_between(
    torchx_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten apps that ended before their first look all end in one round; with batches of
    three, the loop runs other work after each batch, so a round that wakes a thousand
    triggers never holds it for all of them at once."""
    from torchx.pipelines.airflow import poller
    from torchx.runner import get_runner
    from torchx.specs.api import is_terminal

    monkeypatch.setenv("TORCHX_TRACKERS", "")
    monkeypatch.setattr(poller, "WAKE_BATCH", 3)
    handles = [_launch("true") for _ in range(10)]
    with get_runner() as runner:

        def states() -> List[Any]:
            return [(s.state if (s := runner.status(h)) else None) for h in handles]

        ended = poll_until(states, lambda ss: all(s and is_terminal(s) for s in ss), DEADLINE)
    assert all(s and is_terminal(s) for s in ended), ended

    async def scenario() -> List[int]:
        the_poller = poller.TriggerPoller.of_running_loop()
        watches = [the_poller.watch(poller.Watch(h, 0.5, False, None)) for h in handles]
        seen: List[int] = []  # how many were woken, each time the other work ran
        while len(seen) < 1 or seen[-1] < len(watches):
            seen.append(sum(w.changed.is_set() for w in watches))
            await asyncio.sleep(0.001)
        for w in watches:
            the_poller.unwatch(w)
        return seen

    seen = asyncio.run(asyncio.wait_for(scenario(), DEADLINE))
    assert {3, 6, 9} <= set(seen), seen


def test_a_scheduler_whose_round_breaks_fails_its_own_triggers_only(
    torchx_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sessions' stages in one triggerer; the list of one session's scheduler breaks
    with a bug (TypeError, not a backend error): its trigger fails with that error, and the
    other session's stage still runs to its event."""
    from torchx.pipelines.airflow.trigger import TorchXTrigger
    from torchx.runner import get_runner
    from torchx.schedulers.local.scheduler import LocalScheduler

    monkeypatch.setenv("TORCHX_TRACKERS", "")
    real_list = LocalScheduler.list

    def broken_list(self: LocalScheduler) -> Any:
        if self.session_name == "broken":
            raise TypeError("a bug in one scheduler's list")
        return real_list(self)

    monkeypatch.setattr(LocalScheduler, "list", broken_list)
    handles = {}
    for session in ("broken", "sound"):
        with get_runner(session) as runner:
            handles[session] = runner.run_component(
                "utils.sh", ["sh", "-c", "echo hi; sleep 1"], "local_cwd"
            )

    async def outcome(handle: str) -> Any:
        trigger = TorchXTrigger(handle, poll_interval=0.5, get_logs=True)
        try:
            return [e.payload async for e in trigger.run()]
        except TypeError as e:
            return e

    async def scenario() -> List[Any]:
        return await asyncio.gather(*(outcome(h) for h in handles.values()))

    broken, sound = asyncio.run(asyncio.wait_for(scenario(), DEADLINE))
    assert isinstance(broken, TypeError), broken
    [event] = sound
    assert event["state"] == "SUCCEEDED" and event["streamed"] == {"sh/0": 1}, event
