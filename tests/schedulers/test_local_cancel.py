"""local_cwd cancel and process trees, with real processes: a cancel during the launch
sticks, a terminal state never changes, a reused pid is never ours, cancel ends every
process (also TERM-ignoring and ``setsid`` ones) and returns with the final state, and a
replica whose main process dies loses its whole tree."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional

import psutil
import pytest

from tests.polling import poll, poll_until
from tests.processes import job_processes, wait_for_job_processes
from tests.schedulers.test_local_support import (
    alive,
    app,
    app_dir,
    home,
    replica_pids,
    role,
    state,
    torchx,
    tree,
)
from torchx import specs
from torchx.runner import get_runner
from torchx.schedulers.local_scheduler import create_scheduler

__all__ = ["home"]  # the fixture

pytestmark = pytest.mark.usefixtures("home")

LAUNCH = """
    import sys
    from torchx import specs
    from torchx.runner import get_runner
    r = get_runner()
    role = specs.Role("w", ".", entrypoint="sh", args=["-c", "sleep 3"])
    h = r.run(specs.AppDef("t", [role]), "local_cwd")
    print(h, r.wait(h, wait_interval=0.1).state, flush=True)
"""


def _new_request(root: Path, seen: set) -> Optional[Path]:
    if not root.is_dir():
        return None
    for d in root.iterdir():
        if d.name not in seen and (d / "request.json").exists():
            return d
    return None


def test_cancel_during_launch_sticks(home: Path, tmp_path: Path) -> None:
    # freeze the launcher as soon as its request is on disk (before or just after it
    # started the supervisor), cancel from here, then let the launcher go on
    root = home / "local_cwd" / "torchx"
    sched = create_scheduler("torchx")
    seen: set = set()
    for _ in range(4):
        launcher = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(LAUNCH)],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
            cwd=tmp_path,
        )
        try:
            d = poll(lambda: _new_request(root, seen), what="a request on disk")
            launcher.send_signal(signal.SIGSTOP)
            seen.add(d.name)
            sched.cancel(d.name)
            desc = sched.describe(d.name)
            assert desc is not None and desc.state == specs.AppState.CANCELLED, desc
        finally:
            launcher.send_signal(signal.SIGCONT)
        out, _ = launcher.communicate(timeout=120)
        handle, final = out.split()
        assert handle.endswith(d.name) and final == "CANCELLED", out
        assert sched.describe(d.name).state == specs.AppState.CANCELLED  # type: ignore[union-attr]
        assert job_processes(handle) == []


WATCH = """
    import os, sys
    from torchx.schedulers.local_scheduler import create_scheduler
    s = create_scheduler("torchx")
    print("ready", flush=True)
    done = False
    while not done:
        done = os.path.exists(sys.argv[1])  # then one more round, seeing every app
        for a in s.list():
            d = s.describe(a.app_id)
            print(a.app_id, a.state.name, d.state.name if d else "NONE", flush=True)
"""


def test_a_terminal_state_never_changes_while_others_poll(tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    watcher = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WATCH), str(stop)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
        cwd=tmp_path,
    )
    assert watcher.stdout is not None and watcher.stdout.readline() == "ready\n"
    try:
        with get_runner() as runner:
            handles = []
            for _ in range(10):
                h = runner.run(app(role("sleep 0.2")), "local_cwd")
                handles.append(h)
                assert runner.wait(h, wait_interval=0.1).state == specs.AppState.SUCCEEDED  # type: ignore[union-attr]
    finally:
        stop.touch()
        out, _ = watcher.communicate(timeout=60)
    seen: Dict[str, List[str]] = defaultdict(list)
    for line in out.splitlines():
        app_id, listed, described = line.split()
        seen[app_id] += [listed, described]
    assert sorted(seen) == sorted(h.rsplit("/", 1)[1] for h in handles)
    terminal = {"SUCCEEDED", "FAILED", "CANCELLED"}
    for app_id, states in seen.items():
        first = next((i for i, s in enumerate(states) if s in terminal), len(states))
        assert set(states[first:]) <= {"SUCCEEDED"}, (app_id, states)


def _spawn_with_pid(pid: int, argv: List[str]) -> Optional[subprocess.Popen]:
    """A new process that gets exactly ``pid`` (Linux ``ns_last_pid``, needs root)."""
    for _ in range(300):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
        except OSError:
            return None
        p = subprocess.Popen(argv)
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    return None


def test_a_reused_replica_pid_is_never_ours(tmp_path: Path) -> None:
    with get_runner() as runner:
        h = runner.run(app(role("exec sleep 300")), "local_cwd")
        (pid,) = replica_pids(h)
        sup = int((app_dir(h) / "supervisor.pid").read_text().split()[0])
        os.kill(sup, signal.SIGKILL)
        poll(lambda: not alive([sup]), what="supervisor gone")
        os.kill(pid, signal.SIGKILL)
        poll(lambda: not os.path.exists(f"/proc/{pid}"), what="replica reaped")
        impostor = _spawn_with_pid(pid, ["sleep", "300"])
        if impostor is None:  # no ns_last_pid here: make the record name a live stranger
            impostor = subprocess.Popen(["sleep", "300"])
            doc = state(h)
            doc["replicas"][0]["pid"] = impostor.pid
            (app_dir(h) / "state.json").write_text(__import__("json").dumps(doc))
        try:
            status = runner.status(h)
            assert status is not None and status.state == specs.AppState.FAILED, status
            assert "supervisor process died" in status.msg
            runner.cancel(h)
            assert alive([impostor.pid]) == [impostor.pid]
        finally:
            impostor.kill()
            impostor.wait()


def _has_own_session_sleep(procs: List[psutil.Process]) -> bool:
    """Four processes, one of them a ``sleep`` leading its own session."""

    def own_session_sleep(p: psutil.Process) -> bool:
        try:
            return p.name() == "sleep" and os.getsid(p.pid) == p.pid
        except (psutil.Error, ProcessLookupError):
            return False

    return len(procs) == 4 and any(own_session_sleep(p) for p in procs)


def test_cancel_ends_term_ignoring_and_setsid_processes_and_returns_final_state() -> None:
    script = "trap '' TERM; setsid sleep 90 & sleep 90"
    with get_runner() as runner:
        h = runner.run_component("utils.sh", ["bash", "-c", script], "local_cwd")
        wait_for_job_processes(h, 4)  # sh -c (utils.sh), bash and two sleeps
        # the background child is `setsid` (or bash) until it execs sleep: poll, not count
        procs = poll_until(lambda: job_processes(h), _has_own_session_sleep)
        assert _has_own_session_sleep(procs), procs
        out = torchx("cancel", h)
        assert out.returncode == 0 and out.stdout.split() == [h, "CANCELLED"], out
        # cancel returned: everything is gone and the state is final, no waiting
        assert job_processes(h) == []
        assert alive([p.pid for p in procs]) == []
        assert runner.status(h).state == specs.AppState.CANCELLED  # type: ignore[union-attr]


def test_cancel_kills_every_process_of_every_replica() -> None:
    # each replica starts a grandchild in its own session: killing the group alone would miss it
    with get_runner() as runner:
        h = runner.run(app(role("setsid sleep 600 & sleep 600 & wait", n=4)), "local_cwd")
        procs = wait_for_job_processes(h, 12)
        runner.cancel(h)
        assert runner.status(h).state == specs.AppState.CANCELLED  # type: ignore[union-attr]
        assert [r.state for r in runner.status(h).roles[0].replicas] == [  # type: ignore[union-attr]
            specs.AppState.CANCELLED
        ] * 4
    assert alive([p.pid for p in procs]) == []


def test_a_replica_whose_main_process_dies_loses_its_whole_tree() -> None:
    # an elastic role survives losing replica 1, but not with replica 1's processes running
    r = role("setsid sleep 600 & sleep 600 & wait", n=2, min_replicas=1)
    with get_runner() as runner:
        h = runner.run(app(r), "local_cwd")
        wait_for_job_processes(h, 6)
        main0, main1 = replica_pids(h)
        tree0, tree1 = tree(main0), tree(main1)
        assert len(tree0) == len(tree1) == 3
        os.kill(main1, signal.SIGKILL)
        poll(lambda: not alive(tree1), timeout=30, what=f"replica 1's tree {tree1} ended")
        status = poll(
            lambda: (s := runner.status(h)) and s.roles[0].replicas[1].state.name == "FAILED" and s,
            what="replica 1 FAILED",
        )
        assert status.state == specs.AppState.RUNNING
        assert alive(tree0) == tree0
        runner.cancel(h)
    assert alive(tree0) == []


DDP = """
import os, time
print("worker", os.environ["RANK"], flush=True)
time.sleep(600)
"""


def test_a_killed_torchrun_agent_takes_its_workers_with_it(tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(DDP)
    with get_runner() as runner:
        h = runner.run_component("dist.ddp", ["-j", "1x2", "--script", str(script)], "local_cwd")
        (agent,) = replica_pids(h)

        def workers() -> List[int]:
            try:
                kids = psutil.Process(agent).children(recursive=True)
            except psutil.NoSuchProcess:
                return []
            found = [p.pid for p in kids if str(script) in " ".join(p.cmdline())]
            return found if len(found) == 2 else []

        pids = poll(workers, timeout=120, what="2 torchrun workers")
        os.kill(agent, signal.SIGKILL)
        poll(lambda: not alive(pids), timeout=30, what=f"workers {pids} ended")
        status = runner.wait(h, wait_interval=0.1, timeout=60)
        assert status is not None and status.state == specs.AppState.FAILED, status
        assert job_processes(h) == []


def test_a_group_is_signalled_before_its_members_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A parent must get the signal with its children (one ``killpg``), not after them:
    ``sh`` that saw its ``sleep`` die first would go on and print "end"."""
    from torchx.schedulers.local import processes as local_proc

    sh = subprocess.Popen(
        ["sh", "-c", "echo begin; sleep 30; echo end"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert sh.stdout is not None and sh.stdout.readline() == "begin\n"
    sleep = poll(lambda: psutil.Process(sh.pid).children(), what="sh's sleep")[0].pid
    calls: List[tuple] = []
    kill, killpg = os.kill, os.killpg

    def recording_kill(pid: int, sig: int) -> None:
        calls.append(("kill", pid))
        kill(pid, sig)

    def recording_killpg(pgid: int, sig: int) -> None:
        calls.append(("killpg", pgid))
        killpg(pgid, sig)

    monkeypatch.setattr(os, "kill", recording_kill)
    monkeypatch.setattr(os, "killpg", recording_killpg)
    local_proc.signal_pids([sleep, sh.pid], signal.SIGTERM)  # the child listed first
    monkeypatch.undo()
    assert calls[0] == ("killpg", sh.pid), calls
    assert sh.wait(timeout=30) == -signal.SIGTERM
    assert sh.stdout.read() == ""
