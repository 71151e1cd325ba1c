"""local_cwd on a machine shared with other users, through the real CLI: a state root
another user can write is refused before anything in it is read or signalled; a cancel
signals no process whose owner or start time differ from what torchx recorded; a symlink
planted at a state file's name is not followed.

The planted apps are what an attacker writes: a valid request and a supervisor pid (with
its stamp, as torchx records it) naming a live process of ours, for our cancel to signal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple

import pytest

from tests.schedulers.test_local_support import alive, home, torchx
from torchx import specs
from torchx.schedulers.local import processes as procs
from torchx.schedulers.local import protocol
from torchx.specs.serialize import appdef_to_dict

__all__ = ["home"]  # the fixture

NOBODY = 65534
SESSION = "torchx"

needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")


def plant(root: Path, pid: int, pid_stamp: str, app_id: str = "planted-abc") -> str:
    """An app of ``root`` (``$TORCHX_HOME``), running, whose supervisor is ``pid``; its handle."""
    app_dir = root / "local_cwd" / SESSION / app_id
    app_dir.mkdir(parents=True, mode=0o700)
    app = specs.AppDef("planted", [specs.Role("w", ".", entrypoint="true")])
    request: Dict[str, Any] = {
        "app_id": app_id,
        "log_dir": str(app_dir),
        "app": appdef_to_dict(app),
        "roles": {"w": {"max_retries": 0, "retry_policy": "APPLICATION", "min_replicas": 1}},
        "replicas": [],
        "idempotency_token": None,
        "stall_timeout": None,
        "submitted": time.time(),
    }
    (app_dir / protocol.REQUEST).write_text(json.dumps(request))
    (app_dir / protocol.STATE).write_text(json.dumps({"state": "RUNNING", "replicas": []}))
    (app_dir / protocol.PID).write_text(f"{pid} {pid_stamp}")
    return f"local_cwd://{SESSION}/{app_id}"


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """A live process of ours, for planted records to name."""
    p = subprocess.Popen(["sleep", "300"])
    yield p
    p.kill()
    p.wait()


def _snapshot(root: Path) -> Dict[str, Tuple[int, bytes]]:
    return {
        str(p): (p.stat().st_mode, p.read_bytes() if p.is_file() else b"")
        for p in sorted(root.rglob("*"))
    }


def _one_line_refusal(out: subprocess.CompletedProcess[str], path: Path) -> None:
    lines = out.stderr.splitlines()
    assert out.returncode == 1 and len(lines) == 1, out
    assert f"refusing {path}: " in lines[0], out
    assert "set TORCHX_HOME to a directory of your own" in lines[0], out


@needs_root
@pytest.mark.parametrize("level", ["", "local_cwd"])
@pytest.mark.parametrize("unsafe", ["mode 777", "owned by nobody"])
def test_a_root_another_user_can_write_is_refused_and_nothing_is_signalled(
    home: Path, tmp_path: Path, victim: subprocess.Popen[bytes], level: str, unsafe: str
) -> None:
    stamp = procs.stamp(victim.pid)
    assert stamp is not None
    handle = plant(home, victim.pid, stamp)
    bad = home / level if level else home
    if unsafe == "mode 777":
        bad.chmod(0o777)
    else:
        for p in [bad, *bad.rglob("*")]:
            os.chown(p, NOBODY, NOBODY)
    before = _snapshot(home)
    for args in (
        ["cancel", handle],
        ["status", handle],
        ["list", "-s", "local_cwd"],
        ["run", "-s", "local_cwd", "utils.echo"],
    ):
        out = torchx(*args, cwd=tmp_path)
        assert alive([victim.pid]) == [victim.pid], out
        _one_line_refusal(out, bad)
    assert _snapshot(home) == before  # nothing written (no cancel marker, no new app)


def _stamped_then_owned_by_nobody() -> Tuple[subprocess.Popen[str], str]:
    """A process stamped as torchx records it, which then became nobody's (same pid, same
    start time, another owner)."""
    code = "import os, sys; sys.stdin.readline(); os.setuid(65534); print('ok', flush=True);"
    p = subprocess.Popen(
        [sys.executable, "-c", code + " sys.stdin.readline()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    stamp = procs.stamp(p.pid)
    assert stamp is not None and p.stdin is not None and p.stdout is not None
    p.stdin.write("go\n")
    p.stdin.flush()
    assert p.stdout.readline() == "ok\n"
    return p, stamp


def _stamped_before(later: subprocess.Popen[bytes]) -> Tuple[subprocess.Popen[bytes], str]:
    """Another ``sleep``, started at another time than ``later``, and its stamp."""
    deadline = time.monotonic() + 30
    while True:  # start times count clock ticks: two quick starts may share one
        earlier = subprocess.Popen(["sleep", "300"])
        stamp = procs.stamp(earlier.pid)
        assert stamp is not None
        if stamp != procs.stamp(later.pid):  # both ours: they differ by start time only
            return earlier, stamp
        earlier.kill()
        earlier.wait()
        assert time.monotonic() < deadline


@needs_root
def test_a_recorded_pid_whose_owner_changed_is_not_signalled(home: Path, tmp_path: Path) -> None:
    p, stamp = _stamped_then_owned_by_nobody()
    try:
        handle = plant(home, p.pid, stamp)
        out = torchx("cancel", handle, cwd=tmp_path)
        assert out.returncode == 0, out
        assert alive([p.pid]) == [p.pid]
        warnings = [line for line in out.stderr.splitlines() if f"pid {p.pid} " in line]
        assert len(warnings) == 1 and "not signalled" in warnings[0], out.stderr  # logged once
    finally:
        p.kill()
        p.wait()


def test_a_recorded_pid_with_another_start_time_is_not_signalled(
    home: Path, tmp_path: Path, victim: subprocess.Popen[bytes]
) -> None:
    """A guard: the stamp held the start time before it held the owner."""
    other, stamp = _stamped_before(victim)
    try:
        handle = plant(home, victim.pid, stamp)
        out = torchx("cancel", handle, cwd=tmp_path)
        assert out.returncode == 0, out
        assert alive([victim.pid, other.pid]) == [victim.pid, other.pid]
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("name", [protocol.CANCEL, protocol.LOCK])
def test_a_symlink_at_a_state_file_is_not_followed_by_a_write(
    home: Path, tmp_path: Path, name: str
) -> None:
    handle = plant(home, 0, "gone")
    app_dir = home / "local_cwd" / SESSION / handle.rsplit("/", 1)[1]
    target = tmp_path / "created-through-the-symlink"
    (app_dir / name).symlink_to(target)
    out = torchx("cancel", handle, cwd=tmp_path)
    assert out.returncode == 1 and len(out.stderr.splitlines()) == 1, out
    assert not target.exists()


def test_a_symlink_at_a_state_file_is_not_followed_by_a_read(home: Path, tmp_path: Path) -> None:
    handle = plant(home, 0, "gone")
    app_dir = home / "local_cwd" / SESSION / handle.rsplit("/", 1)[1]
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"state": "SUCCEEDED", "replicas": []}))
    (app_dir / protocol.STATE).unlink()
    (app_dir / protocol.STATE).symlink_to(elsewhere)
    out = torchx("status", handle, cwd=tmp_path)
    assert "SUCCEEDED" not in out.stdout + out.stderr, out
    assert "unreadable" in out.stderr, out


def test_a_symlink_at_the_name_a_state_file_is_written_aside_is_not_followed(
    tmp_path: Path,
) -> None:
    import threading

    victim_file = tmp_path / "victim"
    victim_file.write_text("precious")
    state = tmp_path / protocol.STATE
    old_tmp_name = f"{state}.tmp.{os.getpid()}.{threading.get_ident()}"
    os.symlink(victim_file, old_tmp_name)
    protocol.write_atomic(str(state), "{}")
    assert victim_file.read_text() == "precious" and state.read_text() == "{}"
    assert sorted(os.listdir(tmp_path)) == sorted(
        [protocol.STATE, "victim", os.path.basename(old_tmp_name)]
    )
