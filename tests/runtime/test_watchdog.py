"""``python -m torchx.runtime.watchdog`` on real processes: it ends a silent command's
process group with the reason as its last stderr line (and in torchelastic's error file),
passes a command that prints or reports progress through untouched, with its exit code,
and forwards a stop. Its clock restarts after the watchdog itself was stopped."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import psutil
import pytest

from torchx.runtime import watchdog
from torchx.runtime.watchdog import MARK, STALLED_EXIT, StallClock, stall_reason_in

DEADLINE = 120  # generous: the machine is shared; nothing here asserts a time


def watch(timeout: float, code: str, env: Dict[str, str]) -> subprocess.CompletedProcess:
    cmd: List[str] = [sys.executable, "-m", "torchx.runtime.watchdog", f"{timeout:g}", "--"]
    return subprocess.run(
        [*cmd, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        env={**os.environ, **env},
    )


def test_a_silent_command_is_ended_with_the_reason(tmp_path: Path) -> None:
    progress, error, pid = tmp_path / "progress.json", tmp_path / "error.json", tmp_path / "pid"
    progress.write_text(json.dumps({"step": 7}))
    code = (
        f"import os, time; open({str(pid)!r}, 'w').write(str(os.getpid()))\n"
        "print('started', flush=True); time.sleep(600)\n"
    )
    env = {"TORCHX_PROGRESS_FILE": str(progress), "TORCHELASTIC_ERROR_FILE": str(error)}
    done = watch(2, code, env)
    reason = "stalled: no progress or output for 2 s (last step 7)"
    assert done.returncode == STALLED_EXIT, done
    assert done.stdout == "started\n"
    assert done.stderr.strip().splitlines()[-1] == MARK + reason
    assert stall_reason_in(done.stderr) == reason
    assert json.loads(error.read_text())["message"]["message"] == reason
    assert not psutil.pid_exists(int(pid.read_text()))


def test_output_or_progress_keeps_a_command_alive_and_its_exit_code_passes(
    tmp_path: Path,
) -> None:
    prints = "import time\nfor i in range(8):\n    print(i, flush=True); time.sleep(0.5)\n"
    done = watch(2, prints + "raise SystemExit(3)", {})
    assert done.returncode == 3, done
    assert done.stdout.split() == [str(i) for i in range(8)]
    assert stall_reason_in(done.stderr) is None
    progress = tmp_path / "progress.json"
    reports = (
        "import time\nfrom torchx.trackers import report_progress\n"
        "for i in range(8):\n    report_progress(i); time.sleep(0.5)\n"
    )
    done = watch(2, reports, {"TORCHX_PROGRESS_FILE": str(progress)})
    assert done.returncode == 0, done


def test_a_peer_that_shows_life_keeps_a_silent_replica_alive(tmp_path: Path) -> None:
    """The gang is judged as a whole: a peer's file (its log, or its watchdog's beacon)
    that changes is activity; this replica's own output touches its beacon."""
    peer = tmp_path / "peer.active"
    touches = (
        f"import os, time\nfor i in range(10):\n    os.utime({str(peer)!r}); time.sleep(0.5)\n"
    )
    peer.touch()
    cmd = [sys.executable, "-m", "torchx.runtime.watchdog", "2", "--peers", str(tmp_path / "*")]
    beacon = tmp_path / "me.active"
    done = subprocess.run(
        [*cmd, "--beacon", str(beacon), "--", sys.executable, "-c", touches + "print('bye')"],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 0, done  # silent itself for 5 s, with a timeout of 2 s
    assert done.stdout == "bye\n" and beacon.exists()


def test_a_stop_reaches_the_command(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "torchx.runtime.watchdog", "600", "--"]
    proc = subprocess.Popen(
        [*cmd, sys.executable, "-c", "print('up', flush=True); import time; time.sleep(600)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(DEADLINE) == 128 + signal.SIGTERM
    proc.stdout.close()


def _left_running(marker: str) -> List[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if marker in " ".join(proc.info["cmdline"] or []) and proc.status() != "zombie":
                found.append(proc.pid)
    return found


def _stop_many(count: int, when_up: bool) -> None:
    """``count`` watchdogs, 10 at a time, each stopped with SIGTERM as soon as its command
    printed its first line (``when_up``) or at a random moment of its start; afterwards no
    command may be running (each sleeps for a unique time, to be found by it)."""
    marker = f"600.{random.randrange(10**6):06d}"
    rng = random.Random(marker)
    cmd = [sys.executable, "-m", "torchx.runtime.watchdog", "600", "--"]
    cmd += ["sh", "-c", f"echo up; exec sleep {marker}"]
    codes = []
    for start in range(0, count, 10):
        batch = [
            subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            for _ in range(min(10, count - start))
        ]
        for proc in batch:
            assert proc.stdout is not None
            if when_up:
                assert proc.stdout.readline() == "up\n"
            else:
                time.sleep(rng.uniform(0, 0.2))
            proc.send_signal(signal.SIGTERM)
        for proc in batch:
            codes.append(proc.wait(DEADLINE))
            assert proc.stdout is not None
            proc.stdout.close()
    assert _left_running(marker) == []
    # a stop reached the command (143), or came before it started (never -15 after it did)
    assert set(codes) <= {128 + signal.SIGTERM, -signal.SIGTERM}, codes
    if when_up:
        assert set(codes) == {128 + signal.SIGTERM}


def test_a_stop_as_soon_as_the_command_is_up_always_reaches_it() -> None:
    _stop_many(200, when_up=True)


def test_a_stop_at_any_moment_of_the_start_leaves_no_command_running() -> None:
    _stop_many(60, when_up=False)


def test_bad_usage_is_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "torchx.runtime.watchdog", "0", "--", "true"],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1


def test_the_clock_restarts_after_the_watchdog_was_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A suspended job suspends its watchdog: the gap between two checks is not silence."""
    now = [1000.0]
    monkeypatch.setattr(watchdog.time, "monotonic", lambda: now[0])
    clock = StallClock(5, None)
    now[0] += 1
    assert clock.stalled() is None
    now[0] += 60  # stopped for a minute (SIGSTOP, scontrol suspend)
    assert clock.stalled() is None  # starts over
    now[0] += 1
    assert clock.stalled() is None
    for _ in range(4):
        now[0] += 1
        found = clock.stalled(step=3)
    assert found == "stalled: no progress or output for 5 s (last step 3)"


def test_only_where_judges_the_rank0_replica_and_leaves_the_others_alone() -> None:
    """Kubernetes and AWS Batch wrap every replica with ``--only-where INDEX=0``: a silent
    replica of another index runs to its end (DDP ranks that never print), index 0 and an
    unset index are judged."""
    cmd = [sys.executable, "-m", "torchx.runtime.watchdog", "1", "--only-where", "IDX=0", "--"]
    silent = [sys.executable, "-c", "import time; time.sleep(4); raise SystemExit(5)"]

    def run(env: Dict[str, str]) -> subprocess.CompletedProcess:
        base = {k: v for k, v in os.environ.items() if k != "IDX"}
        return subprocess.run(
            [*cmd, *silent], capture_output=True, text=True, timeout=DEADLINE, env={**base, **env}
        )

    other = run({"IDX": "1"})
    assert other.returncode == 5 and MARK not in other.stderr, other
    for env in ({"IDX": "0"}, {}):
        judged = run(env)
        assert judged.returncode == STALLED_EXIT and stall_reason_in(judged.stderr), judged
