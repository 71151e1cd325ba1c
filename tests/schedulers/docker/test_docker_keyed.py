"""Keyed submission on ``local_docker``: the app id comes from the key's token and generation,
so its container names are the claim. A racing loser's first container is refused (409) and
it re-attaches; no loser ever starts its command. Each app's command appends its handle to a
file bind-mounted from the host: its lines are the apps that started their command."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any, List

import pytest

from tests.racing import race_runs
from torchx import specs
from torchx.components import utils
from torchx.runner import Runner, get_runner
from torchx.schedulers.api import (
    IDEMPOTENCY_GENERATION,
    IDEMPOTENCY_TOKEN,
    GenerationTaken,
    idempotency_token,
)
from torchx.schedulers.docker_scheduler import (
    LABEL_APP_ID,
    LABEL_IDEMPOTENCY_TOKEN,
    create_scheduler,
)
from torchx.specs import AppState


def _appending(out: Path, then: str) -> specs.AppDef:
    """An app that appends its handle to ``out/started``, then runs ``then``."""
    app = utils.sh("sh", "-c", f'echo "$TORCHX_JOB_ID" >> /out/started; {then}')
    app.roles[0].mounts.append(specs.BindMount(src_path=str(out), dst_path="/out"))
    return app


def _started(out: Path) -> List[str]:
    path = out / "started"
    return path.read_text().split() if path.exists() else []


def _app_ids(client: Any, token: str) -> set[str]:
    keyed = client.containers.list(
        all=True, filters={"label": f"{LABEL_IDEMPOTENCY_TOKEN}={token}"}
    )
    return {c.labels[LABEL_APP_ID] for c in keyed}


@pytest.fixture()
def out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TORCHX_TRACKERS", raising=False)
    out = tmp_path / "out"
    out.mkdir()
    return out


def test_racing_submitters_start_one_command(docker_client: Any, out: Path) -> None:
    key = f"race-{uuid.uuid4().hex}"
    # the app outlives the race: a racer slowed past its end would rightly start the key again
    app = _appending(out, "sleep 10")
    n = 6
    barrier = threading.Barrier(n)

    def submit(runner: Runner) -> str:
        runner.scheduler_run_opts("local_docker")  # its import before the start line
        barrier.wait(timeout=120)
        return runner.run(app, "local_docker", idempotency_key=key)

    handles, reattached = race_runs(n, submit, trackers={})
    assert len(handles) == n and len(set(handles)) == 1, handles
    handle = handles[0]
    with get_runner(trackers={}) as runner:
        status = runner.wait(handle, wait_interval=0.5, timeout=180)
    assert status is not None and status.state == AppState.SUCCEEDED, status
    assert _started(out) == [handle]  # exactly one command ever started
    assert _app_ids(docker_client, idempotency_token(key)) == {handle.rsplit("/", 1)[1]}
    assert reattached.count(False) == 1, reattached  # one launched, the others re-attached
    assert handle.endswith(f"-{idempotency_token(key)[-12:]}-0"), handle


def test_a_retry_after_failure_is_the_next_generation_and_stale_ids_are_refused(
    docker_client: Any, out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = f"retry-{uuid.uuid4().hex}"
    token = idempotency_token(key)
    with get_runner(trackers={}) as runner:
        failed = runner.run(_appending(out, "exit 3"), "local_docker", idempotency_key=key)
        status = runner.wait(failed, wait_interval=0.5, timeout=180)
        assert status is not None and status.state == AppState.FAILED, status
        retried = runner.run(_appending(out, "true"), "local_docker", idempotency_key=key)
        assert not runner.reattached(retried)
        status = runner.wait(retried, wait_interval=0.5, timeout=180)
        assert status is not None and status.state == AppState.SUCCEEDED, status
    assert failed.endswith(f"{token[-12:]}-0") and retried.endswith(f"{token[-12:]}-1")
    assert _started(out) == [failed, retried]

    # A submitter whose lookup was stale picks generation 0, an ended app's id: the engine
    # refuses it, nothing starts, and it is told which generation to submit as instead.
    sched = create_scheduler("torchx")
    stale = _appending(out, "true")
    stale.metadata.update({IDEMPOTENCY_TOKEN: token, IDEMPOTENCY_GENERATION: "0"})
    with pytest.raises(GenerationTaken) as taken:
        sched.schedule_keyed(token, sched.submit_dryrun(stale, {}), False)
    assert taken.value.generation == 2
    # asked to reuse a SUCCEEDED app, it re-attaches to it instead
    stale.metadata[IDEMPOTENCY_GENERATION] = "1"
    info = sched.submit_dryrun(stale, {})
    assert sched.schedule_keyed(token, info, True) == (retried.rsplit("/", 1)[1], None)
    assert _started(out) == [failed, retried]

    # the Runner given that stale view submits again as the next free generation
    monkeypatch.setattr(Runner, "_find_key", lambda *args: (None, 0))
    with get_runner(trackers={}) as runner:
        third = runner.run(_appending(out, "true"), "local_docker", idempotency_key=key)
        status = runner.wait(third, wait_interval=0.5, timeout=180)
        assert status is not None and status.state == AppState.SUCCEEDED, status
    assert third.endswith(f"{token[-12:]}-2"), third
    assert _started(out) == [failed, retried, third]
    assert len(_app_ids(docker_client, token)) == 3
