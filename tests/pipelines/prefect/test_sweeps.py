"""Sweeps: ``.map`` over torchx tasks against a real Prefect server and real local_cwd apps.

Each mapped item is its own stage (key, task-run name, artifacts, app), whatever its
arguments, and the flow's task runner bounds the threads (``max_workers``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import List

import pytest

from tests.pipelines.prefect.reads import flow_run_artifacts, flow_run_task_runs
from tests.polling import poll_until

SWEEP = 50
MAX_WORKERS = 8


class PeakThreads:
    """This process's largest thread count while the block runs (sampled every 50 ms)."""

    def __init__(self) -> None:
        self.peak = threading.active_count()
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.05):
            self.peak = max(self.peak, threading.active_count())

    def __enter__(self) -> PeakThreads:
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._sampler.join()


@pytest.mark.slow
def test_a_50_way_map_gives_each_item_its_own_stage_with_bounded_threads(env: Path) -> None:
    """Ten distinct messages, five items each: still 50 apps, 50 names, 50 artifact sets,
    50 tracker runs under the flow run's; threads bounded by the task runner's workers."""
    from prefect import flow
    from prefect.task_runners import ThreadPoolTaskRunner

    from torchx.pipelines.prefect import close_pipeline_run, run
    from torchx.runner import get_runner
    from torchx.trackers.api import build_trackers

    @flow(
        task_runner=ThreadPoolTaskRunner(max_workers=MAX_WORKERS),
        on_completion=[close_pipeline_run],
    )
    def sweep() -> List[str]:
        args = [["--msg", f"lr-{i % 10}"] for i in range(SWEEP)]
        return run.map("utils.echo", args, poll_interval=0.5).result()

    before = threading.active_count()
    with PeakThreads() as threads:
        state = sweep(return_state=True)
    handles = state.result()
    assert len(set(handles)) == SWEEP, handles
    with get_runner() as runner:
        assert len(runner.list("local_cwd")) == SWEEP

    fid = state.state_details.flow_run_id
    want = sorted(f"echo-{i}" for i in range(SWEEP))
    names = poll_until(lambda: _task_run_names(fid), want.__eq__, every=0.5)
    assert names == want, names
    replicas = {k for k in flow_run_artifacts(fid) if k and k.startswith("torchx-replicas-")}
    assert replicas == {f"torchx-replicas-echo-{i}" for i in range(SWEEP)}, replicas

    tracker = build_trackers({"mlflow": os.environ["TORCHX_TRACKER_MLFLOW_CONFIG"]})[0]
    pipeline = f"prefect://sweep/{fid}"
    assert sorted(tracker.run_ids(parent_run_id=pipeline)) == sorted(handles)

    # per running stage: its worker, its progress follower and one log follower per
    # replica; plus a few of Prefect's own (API logs, events) and the sampler. Not per item:
    # 50 items at once would hold over 150 (a peak of 21 threads measured with 8 workers)
    assert threads.peak - before <= 3 * MAX_WORKERS + 8, (before, threads.peak)


def test_one_unmapped_key_is_numbered_per_item_and_wait_follows_the_handles(env: Path) -> None:
    """``key=unmapped("train")`` with equal arguments: one app per item, ``train-<i>``;
    ``wait.map`` over the handles names its items after their apps."""
    from prefect import flow, unmapped

    from torchx.pipelines.prefect import submit, wait

    @flow
    def keyed() -> List[str]:
        retried = submit.with_options(retries=1)  # still numbers its items
        handles = retried.map("utils.echo", [["--msg", "same"]] * 3, key=unmapped("train"))
        wait.map(handles, poll_interval=0.5).result()
        return handles.result()

    state = keyed(return_state=True)
    handles = state.result()
    assert len(set(handles)) == 3, handles
    fid = state.state_details.flow_run_id
    want = sorted([f"submit-train-{i}" for i in range(3)] + [f"wait-echo-{i}" for i in range(3)])
    names = poll_until(lambda: _task_run_names(fid), want.__eq__, every=0.5)
    assert names == want, names
    replicas = {k for k in flow_run_artifacts(fid) if k and k.startswith("torchx-replicas-")}
    assert replicas == {f"torchx-replicas-echo-{i}" for i in range(3)}, replicas


def test_a_repeated_key_in_a_map_is_an_error_before_anything_runs(env: Path) -> None:
    from prefect import flow

    from torchx.pipelines.prefect import submit
    from torchx.runner import get_runner

    @flow
    def repeated() -> None:
        submit.map(
            "utils.sh", [["touch", str(env / "a")], ["touch", str(env / "b")]], key=["x", "x"]
        )

    state = repeated(return_state=True)
    with pytest.raises(ValueError, match=r"key repeats \['x'\] in a .map"):
        state.result()
    with get_runner() as runner:
        assert runner.list("local_cwd") == []


def _task_run_names(flow_run_id: object) -> List[str]:
    """The flow run's task-run names, sorted. Prefect's server records task runs from their
    events, after the flow call returns: a loaded machine sees them late."""
    return sorted(t.name for t in flow_run_task_runs(flow_run_id))
