"""``local_cwd`` claims an idempotency key before launching: a claim whose claimant died
before launching, or whose launch failed, blocks no later submitter; a claimant still
launching is waited for, and its app is the one everybody gets."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import List

import pytest

from tests.polling import poll
from torchx.components.utils import sh
from torchx.runner import get_runner
from torchx.schedulers.api import idempotency_token
from torchx.specs import AppState

# claims ``key`` for an app it then launches only once ``go`` exists (or never: ``die``)
CLAIMANT = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from torchx.components.utils import sh
    from torchx.schedulers.api import IDEMPOTENCY_TOKEN, idempotency_token
    from torchx.schedulers.local_scheduler import create_scheduler
    key, out, go = sys.argv[1:4]
    app = sh("sh", "-c", f"echo claimant >> {out}")
    token = idempotency_token(key)
    app.metadata[IDEMPOTENCY_TOKEN] = token
    sched = create_scheduler("torchx")
    info = sched.submit_dryrun(app, {})
    launch = sched.schedule

    def schedule_once_claimed(info):
        print(info.request.app_id, flush=True)
        if go == "die":
            os.kill(os.getpid(), signal.SIGKILL)  # a submitter crashing between claim and launch
        while not os.path.exists(go):
            time.sleep(0.01)
        return launch(info)

    sched.schedule = schedule_once_claimed
    assert sched.schedule_keyed(token, info, False)[1] == info.request.app_id
""")


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("TORCHX_HOME", str(home))
    monkeypatch.delenv("TORCHX_TRACKERS", raising=False)
    monkeypatch.chdir(tmp_path)
    return home


def _claimant(key: str, out: Path, go: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLAIMANT, key, str(out), go], stdout=subprocess.PIPE, text=True
    )


def _waiting_on_claim(thread: threading.Thread) -> bool:
    """Whether ``thread`` is inside ``claims.claim`` (from its live stack)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "claim" and code.co_filename.endswith("/local/claims.py"):
            return True
        frame = frame.f_back
    return False


def _lines(path: Path) -> List[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_claimant_that_died_before_launching_blocks_nobody(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "started"
    claimant = _claimant("k", out, "die")
    claimed = claimant.stdout.readline().strip()  # type: ignore[union-attr]
    assert claimant.wait(timeout=60) == -9
    assert list((home / "local_cwd" / "torchx" / ".tokens").glob("*/.claim.1"))
    with get_runner(trackers={}) as runner:
        app = sh("sh", "-c", f"echo retry >> {out}")
        handle = runner.run(app, "local_cwd", idempotency_key="k")
        assert not handle.endswith(claimed)  # the dead claim did not hold the key
        status = runner.wait(handle, wait_interval=1, timeout=60)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        assert runner.run(app, "local_cwd", idempotency_key="k", reattach_succeeded=True) == handle
    assert _lines(out) == ["retry"]


def test_a_racer_waits_for_a_claimant_that_is_launching_and_gets_its_app(
    home: Path, tmp_path: Path
) -> None:
    out, go = tmp_path / "started", tmp_path / "go"
    claimant = _claimant("k", out, str(go))
    claimed = claimant.stdout.readline().strip()  # type: ignore[union-attr]
    got: List[str] = []
    with get_runner(trackers={}) as runner:
        app = sh("sh", "-c", f"echo racer >> {out}")
        racer = threading.Thread(
            target=lambda: got.append(runner.run(app, "local_cwd", idempotency_key="k"))
        )
        racer.start()
        poll(lambda: _waiting_on_claim(racer), timeout=60, what="the racer waits on the claim")
        go.touch()  # only now does the claimant launch its app
        racer.join(timeout=120)
        assert claimant.wait(timeout=60) == 0
        assert got == [f"local_cwd://torchx/{claimed}"]
        status = runner.wait(got[0], wait_interval=1, timeout=60)
        assert status is not None and status.state == AppState.SUCCEEDED, status
        sched = runner._scheduler("local_cwd")
        assert [a.app_id for a in sched.find_by_idempotency_token(idempotency_token("k"))] == [
            claimed
        ]
    assert _lines(out) == ["claimant"]


def test_a_failed_launch_gives_its_claim_up(home: Path, tmp_path: Path) -> None:
    """The claimant lives on after its launch failed: the next submit must not wait for it."""
    out = tmp_path / "started"
    app = sh("sh", "-c", f"echo second >> {out}")
    with get_runner(trackers={"no_such_tracker": None}) as broken:
        with pytest.raises(Exception, match="no_such_tracker"):
            broken.run(app, "local_cwd", idempotency_key="k")
    with get_runner(trackers={}) as runner:
        handle = runner.run(app, "local_cwd", idempotency_key="k")
        status = runner.wait(handle, wait_interval=1, timeout=60)
        assert status is not None and status.state == AppState.SUCCEEDED, status
    poll(lambda: _lines(out) == ["second"], timeout=30, what="one app ran")
