"""local_cwd readers (``describe``, ``list``, ``log_iter``) write nothing, also where the
supervisor cannot record the state (it died, or never started), and what they report is
what the writers record later: a late supervisor agrees, a cancel keeps it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Dict, Tuple

import pytest

from tests.polling import poll
from tests.schedulers.test_local_support import alive, app, app_dir, home, replica_pids, role
from torchx import specs
from torchx.runner import get_runner
from torchx.schedulers.local.supervisor import command
from torchx.schedulers.local_scheduler import UnreadableAppError, create_scheduler

__all__ = ["home"]

pytestmark = pytest.mark.usefixtures("home")


def _snapshot(d: Path) -> Dict[str, Tuple[int, int]]:
    """Every file under ``d`` with its size and modification time."""
    return {
        str(p.relative_to(d)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in d.rglob("*")
        if p.is_file()
    }


def test_readers_write_nothing_after_the_supervisor_died() -> None:
    with get_runner() as runner:
        h = runner.run(app(role("exec sleep 300")), "local_cwd")
        (pid,) = replica_pids(h)
        d = app_dir(h)
        sup = int((d / "supervisor.pid").read_text().split()[0])
        os.kill(sup, signal.SIGKILL)
        poll(lambda: not alive([sup]), what="supervisor gone")
        sched = create_scheduler("torchx")
        app_id = h.rsplit("/", 1)[1]
        before = _snapshot(d)
        desc = sched.describe(app_id)
        assert desc is not None and desc.state == specs.AppState.RUNNING, desc
        assert "replicas still running" in desc.msg
        os.kill(pid, signal.SIGKILL)
        poll(lambda: not os.path.exists(f"/proc/{pid}"), what="replica reaped")
        desc = sched.describe(app_id)
        assert desc is not None and desc.state == specs.AppState.FAILED, desc
        assert "supervisor process died" in desc.msg
        assert [(a.app_id, a.state) for a in sched.list()] == [(app_id, specs.AppState.FAILED)]
        assert list(runner.log_lines(h, "w", should_tail=True)) == []  # ends, as the app did
        assert _snapshot(d) == before
        assert json.loads((d / "state.json").read_text())["state"] == "RUNNING"
        runner.cancel(h)  # the writer records what the readers saw
        assert json.loads((d / "state.json").read_text())["state"] == "FAILED"
        assert sched.describe(app_id).state == specs.AppState.FAILED  # type: ignore[union-attr]


def test_a_request_that_never_started_reads_failed_and_a_late_supervisor_agrees(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"
    with get_runner() as runner:
        h = runner.run(app(role(f"touch {marker}")), "local_cwd")
        runner.wait(h, wait_interval=0.1)
    assert marker.exists()
    marker.unlink()
    d = app_dir(h)
    for name in ("state.json", "supervisor.pid"):  # as if its supervisor never ran
        (d / name).unlink()
    request = json.loads((d / "request.json").read_text())
    request["submitted"] -= 3600
    (d / "request.json").write_text(json.dumps(request))

    sched = create_scheduler("torchx")
    before = _snapshot(d)
    desc = sched.describe(request["app_id"])
    assert desc is not None and desc.state == specs.AppState.FAILED, desc
    assert "never started" in desc.msg
    assert _snapshot(d) == before and not (d / "state.json").exists()

    late = subprocess.run(command(str(d)), capture_output=True, text=True, timeout=60)
    assert late.returncode == 0, late.stderr
    doc = json.loads((d / "state.json").read_text())
    assert doc["state"] == "FAILED" and "never started" in doc["msg"], doc
    assert not marker.exists()  # it ran nothing


def test_a_request_of_the_wrong_shape_names_the_field() -> None:
    with get_runner() as runner:
        h = runner.run(app(role("true")), "local_cwd")
        runner.wait(h, wait_interval=0.1)
    d = app_dir(h)
    request = json.loads((d / "request.json").read_text())
    del request["replicas"][0]["args"]
    (d / "request.json").write_text(json.dumps(request))
    with pytest.raises(UnreadableAppError, match=r"no 'replicas\[0\]\.args'"):
        create_scheduler("torchx").describe(request["app_id"])
    late = subprocess.run(command(str(d)), capture_output=True, text=True, timeout=60)
    assert late.returncode != 0 and "replicas[0].args" in late.stderr
