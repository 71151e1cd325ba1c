"""Keyed submission on a real Ray head: the submission id comes from the key's token and
generation, and Ray refuses a reused one, so a racing loser never starts its command. Each
app's command appends its handle to a file: its lines are the apps that started."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import List

import pytest

from tests.polling import poll_until
from tests.runner.test_racing_submitters import race
from torchx import specs
from torchx.components import utils
from torchx.runner import get_runner
from torchx.schedulers.api import (
    IDEMPOTENCY_GENERATION,
    IDEMPOTENCY_TOKEN,
    GenerationTaken,
    ListAppResponse,
    idempotency_token,
)
from torchx.schedulers.ray_scheduler import create_scheduler
from torchx.specs import AppState, is_terminal


def _started_apps(started: Path) -> List[str]:
    return started.read_text().split() if started.exists() else []


def _settled(key: str) -> List[ListAppResponse]:
    """The key's apps once none is live any more."""
    sched, token = create_scheduler("torchx"), idempotency_token(key)
    return poll_until(
        lambda: sched.find_by_idempotency_token(token),
        lambda found: all(is_terminal(a.state) for a in found),
        timeout=300,
    )


def test_racing_submitters_get_one_job_and_one_command_on_ray(env: Path) -> None:
    key = f"ray-race-{uuid.uuid4().hex}"
    # the app outlives the race: a racer slowed past its end would rightly start the key again
    handles, started = race(env, "ray", key, 5, seconds=10)
    assert len(set(handles)) == 1, sorted(set(handles))
    handle = handles[0]
    with get_runner(trackers={}) as runner:
        status = runner.wait(handle, wait_interval=1, timeout=300)
    assert status is not None and status.state == AppState.SUCCEEDED, status
    assert [a.app_id for a in _settled(key)] == [handle.rsplit("/", 1)[1]]
    assert _started_apps(started) == [handle]  # exactly one command ever started
    assert handle.endswith(f"-{idempotency_token(key)[-12:]}-0"), handle

    # Two submitters that both saw no app, one after the other (so the test need not win a
    # timing race): the second is refused by Ray and launches nothing.
    token = idempotency_token(f"ray-pair-{uuid.uuid4().hex}")
    app = utils.sh("sh", "-c", f'echo "$TORCHX_JOB_ID" >> {started}')
    app.metadata.update({IDEMPOTENCY_TOKEN: token, IDEMPOTENCY_GENERATION: "0"})
    sched = create_scheduler("torchx")
    first, ours = sched.schedule_keyed(token, sched.submit_dryrun(app, {}), False)
    assert ours == first
    assert sched.schedule_keyed(token, sched.submit_dryrun(app, {}), False) == (first, None)
    assert [a.app_id for a in sched.find_by_idempotency_token(token)] == [first]


def test_a_retry_after_failure_is_generation_one_and_a_stale_id_is_refused_on_ray(
    env: Path,
) -> None:
    key = f"ray-retry-{uuid.uuid4().hex}"
    token = idempotency_token(key)
    started = env / "started"

    def appending(then: str) -> specs.AppDef:
        return utils.sh("sh", "-c", f'echo "$TORCHX_JOB_ID" >> {started}; {then}')

    with get_runner(trackers={}) as runner:
        failed = runner.run(appending("exit 3"), "ray", {}, idempotency_key=key)
        status = runner.wait(failed, wait_interval=1, timeout=300)
        assert status is not None and status.state == AppState.FAILED, status
        retried = runner.run(appending("true"), "ray", {}, idempotency_key=key)
        assert not runner.reattached(retried)
        status = runner.wait(retried, wait_interval=1, timeout=300)
        assert status is not None and status.state == AppState.SUCCEEDED, status
    assert failed.endswith(f"{token[-12:]}-0") and retried.endswith(f"{token[-12:]}-1")
    assert _started_apps(started) == [failed, retried]

    # a submitter whose lookup was stale picks generation 0, a stopped job's id: Ray refuses
    # it, nothing starts, and it is told the generation to submit as instead
    sched = create_scheduler("torchx")
    stale = appending("true")
    stale.metadata.update({IDEMPOTENCY_TOKEN: token, IDEMPOTENCY_GENERATION: "0"})
    with pytest.raises(GenerationTaken) as taken:
        sched.schedule_keyed(token, sched.submit_dryrun(stale, {}), False)
    assert taken.value.generation == 2
    stale.metadata[IDEMPOTENCY_GENERATION] = "1"  # a SUCCEEDED job, asked to reuse it
    info = sched.submit_dryrun(stale, {})
    assert sched.schedule_keyed(token, info, True) == (retried.rsplit("/", 1)[1], None)
    assert _started_apps(started) == [failed, retried]
