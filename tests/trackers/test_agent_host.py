"""The machine's tracker agent host: one warm process forks every caller's agent.

Each test gives its callers a runtime dir of their own (``$XDG_RUNTIME_DIR``), so it gets
a host of its own, and uses the fsspec tracker (no mlflow import): what is tested is the
host's plumbing, which is the same for every backend.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import psutil
import pytest

from tests.polling import poll_until
from torchx.trackers.api import build_trackers

CALLER = textwrap.dedent("""
    import json, os, signal, sys
    from torchx.trackers.agent import Agent, AgentTracker

    detach, job, store, then = sys.argv[1] == "launcher", sys.argv[2], sys.argv[3], sys.argv[4]
    agent = Agent(detach=detach)
    tracker = AgentTracker("fsspec", store, agent)
    tracker.add_metadata(job, pid=os.getpid())
    if then == "fail":
        agent.call("fsspec", store, "no_such_method")
    if then == "die":
        agent._drain()
        agent.flush()  # the agent has it, then the caller dies before closing
        os.kill(os.getpid(), signal.SIGKILL)
    if then == "read":
        meta = dict(tracker.metadata(job))
        print(json.dumps({"meta": meta, "agent": type(agent._proc).__name__}))
""")


@pytest.fixture()
def env(tmp_path: Path) -> Dict[str, str]:
    runtime = tempfile.mkdtemp(prefix="tx-")  # short: a socket's path holds 108 bytes
    return dict(
        os.environ,
        XDG_RUNTIME_DIR=str(runtime),
        TORCHX_HOME=str(tmp_path / "home"),
        TORCHX_TRACKER_AGENT_HOST_IDLE="30",
    )


def _call(
    env: Dict[str, str], store: Path, job: str, mode: str = "launcher", then: str = "read"
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CALLER, mode, job, str(store), then],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _read(env: Dict[str, str], store: Path, job: str, mode: str = "launcher") -> Dict[str, Any]:
    run = _call(env, store, job, mode)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def _hosts(env: Dict[str, str]) -> List[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "torchx.trackers.agent_host" in cmd and env["XDG_RUNTIME_DIR"] in cmd:
            found.append(p)
    return found


@pytest.fixture(autouse=True)
def _stop_hosts(env: Dict[str, str]) -> Any:
    yield
    for p in _hosts(env):
        p.kill()
    shutil.rmtree(env["XDG_RUNTIME_DIR"], ignore_errors=True)


def test_callers_share_one_host_and_each_gets_its_own_agent(
    env: Dict[str, str], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    first = _read(env, store, "job-a")
    second = _read(env, store, "job-b", mode="rank")  # a rank uses a host that is there
    assert first["agent"] == second["agent"] == "HostedAgent"
    assert first["meta"]["pid"] != second["meta"]["pid"]
    assert len(_hosts(env)) == 1
    sockets = list((Path(env["XDG_RUNTIME_DIR"]) / "torchx").glob("agent-*.sock"))
    assert len(sockets) == 1 and oct(sockets[0].parent.stat().st_mode & 0o777) == "0o700"


@pytest.fixture()
def warm(env: Dict[str, str], tmp_path: Path) -> Path:
    """A store whose host runs (a launcher started it): what a job's ranks find."""
    store = tmp_path / "store"
    assert _read(env, store, "launcher")["agent"] == "HostedAgent"
    return store


def test_a_callers_calls_are_applied_after_it_is_killed(env: Dict[str, str], warm: Path) -> None:
    run = _call(env, warm, "job-k", mode="rank", then="die")
    assert run.returncode == -signal.SIGKILL
    tracker = build_trackers({"fsspec": str(warm)})[0]
    assert "pid" in poll_until(lambda: dict(tracker.metadata("job-k")), bool)


def test_a_failed_call_is_reported_on_the_callers_stderr(env: Dict[str, str], warm: Path) -> None:
    run = _call(env, warm, "job-f", mode="rank", then="fail")
    assert run.returncode == 0
    assert "no_such_method failed" in run.stderr  # the forked agent wrote to the rank's stderr


def test_a_jobs_own_process_never_starts_a_host(env: Dict[str, str], tmp_path: Path) -> None:
    out = _read(dict(env, TORCHX_JOB_ID="local_cwd://x/app"), tmp_path / "store", "job-j")
    assert out == {"meta": {"pid": out["meta"]["pid"]}, "agent": "Popen"}
    assert _hosts(env) == []


def test_no_host_when_turned_off_or_the_runtime_dir_is_not_private(
    env: Dict[str, str], tmp_path: Path
) -> None:
    off = _read(dict(env, TORCHX_TRACKER_AGENT_HOST="0"), tmp_path / "store", "job-o")
    assert off["agent"] == "Popen" and off["meta"]
    shared = Path(env["XDG_RUNTIME_DIR"]) / "torchx"
    shared.mkdir()
    shared.chmod(0o777)
    unsafe = _read(env, tmp_path / "store", "job-u")
    assert unsafe["agent"] == "Popen" and unsafe["meta"]
    assert _hosts(env) == []


def test_an_idle_host_exits_and_the_next_caller_starts_another(
    env: Dict[str, str], tmp_path: Path
) -> None:
    env["TORCHX_TRACKER_AGENT_HOST_IDLE"] = "1"
    store = tmp_path / "store"
    assert _read(env, store, "job-1")["agent"] == "HostedAgent"
    first = {p.pid for p in poll_until(lambda: _hosts(env), bool)}
    assert poll_until(lambda: _hosts(env), lambda hosts: not hosts) == []
    assert not list((Path(env["XDG_RUNTIME_DIR"]) / "torchx").glob("*.sock"))
    assert _read(env, store, "job-2")["meta"]
    assert {p.pid for p in _hosts(env)}.isdisjoint(first)
