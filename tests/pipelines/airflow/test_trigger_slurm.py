"""TorchXTriggers over real Slurm jobs (the local cluster) share one ``squeue`` per poll
round, counted by a shim ahead of the real one on the PATH."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from tests.schedulers.test_slurm_scheduler import cluster, env  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slurm

DEADLINE = 300.0


def _squeue_shim(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``squeue`` that appends a line to the returned file, then runs the real one."""
    real = shutil.which("squeue")
    assert real is not None
    shim = tmp / "shim"
    shim.mkdir()
    calls = tmp / "squeue.calls"
    calls.touch()
    (shim / "squeue").write_text(f'#!/bin/sh\necho >> "{calls}"\nexec {real} "$@"\n')
    (shim / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    return calls


def _count(calls: Path) -> int:
    return len(calls.read_text().splitlines())


def test_slurm_triggers_share_one_squeue_per_round(
    env: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torchx.pipelines.airflow import poller
    from torchx.pipelines.airflow.trigger import TorchXTrigger
    from torchx.runner import get_runner

    monkeypatch.setenv("TORCHX_TRACKERS", "")
    n = 3
    with get_runner() as runner:
        handles = [
            runner.run_component(
                "utils.sh", ["sh", "-c", f"echo job {i}; sleep 15"], "slurm", cfg={"time": "5"}
            )
            for i in range(n)
        ]
    calls = _squeue_shim(env, monkeypatch)

    async def scenario() -> Tuple[List[Dict[str, Any]], int, int]:
        triggers = [TorchXTrigger(h, poll_interval=0.5, get_logs=True) for h in handles]

        async def first(trigger: TorchXTrigger) -> Dict[str, Any]:
            return [e.payload async for e in trigger.run()][0]

        runs = asyncio.gather(*(first(t) for t in triggers))
        the_poller = poller.TriggerPoller.of_running_loop()
        await asyncio.sleep(0.1)
        while the_poller.unseen():  # each job's first look (a describe of its own) is done
            await asyncio.sleep(0.1)
        start_rounds, start_squeues = the_poller.rounds, _count(calls)
        # three rounds while the jobs pend or run (however slow the machine), or their end
        while the_poller.rounds - start_rounds < 3 and not runs.done():
            await asyncio.sleep(0.1)
        rounds, squeues = the_poller.rounds - start_rounds, _count(calls) - start_squeues
        return await runs, rounds, squeues

    events, rounds, squeues = asyncio.run(asyncio.wait_for(scenario(), DEADLINE))
    assert rounds >= 1, rounds
    assert squeues <= rounds + 1, (squeues, rounds)  # one a round (+1: a round under way)
    for handle, event in zip(handles, events, strict=True):
        assert event["app_handle"] == handle and event["state"] == "SUCCEEDED", event
        assert event["streamed"] == {"sh/0": 1}, event
