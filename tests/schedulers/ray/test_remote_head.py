"""The ray scheduler against a Ray head on "another host": a venv of its own (torch, ray and
a non-editable torchx, ``scripts/ray_cluster_venv.sh``), started in a mount namespace where
the submitter's tree, venv, temp dirs and ``$TORCHX_HOME`` are empty tmpfs. It shares only
the loopback network with the submitter, as a KubeRay or remote head would. Its ports are
free ephemeral ones, so it runs beside the other Ray tests' head."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List

import psutil
import pytest

from tests.mlflow_server import free_port
from tests.polling import poll_until
from tests.processes import wait_for_job_processes
from tests.schedulers.ray.head import ray_head
from torchx import specs

ROOT = Path(__file__).resolve().parents[3]
TORCHX = os.path.join(os.path.dirname(sys.executable), "torchx")
UPLOAD_LIMIT = 4_000_000
TRAIN = """\
import os, sys
import torch.distributed as dist

dist.init_process_group("gloo")
t = __import__("torch").ones(1)
dist.all_reduce(t)
print(
    f"rank {dist.get_rank()} of {int(t.item())} python {sys.executable}"
    f" sees the submitter: {os.path.exists(SUBMITTER)} data uploaded: {os.path.exists('data')}",
    flush=True,
)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def remote_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, str]]:
    """The head's dashboard URL and its venv (built on the first run on a machine)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("another host needs root and unshare (a private mount namespace)")
    if not os.path.exists(os.path.join(os.path.dirname(sys.executable), "ray")):
        pytest.skip("ray is not installed (pip install 'torchx[ray]')")
    venv = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ray_cluster_venv.sh")],
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    ).stdout.strip()
    # what only the submitter has: its tree and venv, its temp dirs, its $TORCHX_HOME
    hide = [str(ROOT), sys.prefix, str(tmp_path_factory.getbasetemp()), os.environ["TORCHX_HOME"]]
    env = {  # the cluster's own environment: nothing of ours
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "RAY_max_grpc_message_size": str(UPLOAD_LIMIT),  # Ray's upload limit, made small
    }
    log = tmp_path_factory.mktemp("remote-head") / "head.log"
    with ray_head(f"{venv}/bin", log, env, num_cpus=8, hide=hide) as url:
        yield {"url": url, "venv": venv}


@pytest.fixture()
def submitter(remote_head: Dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", remote_head["url"])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("TORCHX_TRACKERS", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _tx(*args: str, env: Dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TORCHX, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, **(env or {})),
    )


def _log_lines(handle: str) -> List[str]:
    return _tx("log", handle).stdout.splitlines()


def test_echo_succeeds_with_its_log_and_status_from_the_submitter(submitter: Path) -> None:
    run = _tx("run", "-s", "ray", "--wait", "utils.echo", "--msg", "hello from afar")
    assert run.returncode == 0, run.stdout + run.stderr
    handle = run.stdout.splitlines()[0]
    assert "State: SUCCEEDED" in _tx("status", handle).stdout
    assert _log_lines(handle) == ["echo/0 hello from afar"]
    described = _tx("describe", handle)
    assert described.returncode == 0 and "hello from afar" in described.stdout


def test_ddp_runs_the_script_from_the_submitters_cwd(
    submitter: Path, remote_head: Dict[str, str]
) -> None:
    (submitter / "train.py").write_text(f"SUBMITTER = {str(ROOT / 'pyproject.toml')!r}\n{TRAIN}")
    (submitter / "data").mkdir()
    (submitter / "data" / "big.bin").write_bytes(os.urandom(UPLOAD_LIMIT + 1_000_000))
    (submitter / ".torchxignore").write_text("data\n")
    args = ["-j", "2x1", "--script", "train.py", "--rdzv_port", str(free_port())]
    # within the head's upload limit only because .torchxignore leaves data/ out
    run = _tx("run", "-s", "ray", "--wait", "dist.ddp", *args)
    assert run.returncode == 0, run.stdout + run.stderr
    handle = run.stdout.splitlines()[0]
    assert "State: SUCCEEDED" in _tx("status", handle).stdout
    lines = _log_lines(handle)
    python = re.escape(f"{remote_head['venv']}/bin/python")  # the cluster's own Python
    for rank in (0, 1):
        seen = "sees the submitter: False data uploaded: False"
        want = rf"rank {rank} of 2 python {python}\S* {seen}$"
        assert any(re.search(want, line) for line in lines), lines
    # past Ray's limit: one line naming the way out, nothing submitted
    (submitter / ".torchxignore").unlink()
    big = _tx("run", "-s", "ray", "dist.ddp", *args)
    assert big.returncode == 1 and "Traceback" not in big.stderr, big.stderr
    error = big.stderr.splitlines()[-1]  # after Ray's own INFO lines about the upload
    assert "too large for Ray to upload" in error and ".torchxignore" in error, big.stderr
    assert "working_dir=<path on the cluster>" in error


def test_cancel_from_the_submitter_stops_the_replicas(submitter: Path) -> None:
    run = _tx("run", "-s", "ray", "utils.sh", "--num_replicas", "2", "sleep", "600")
    assert run.returncode == 0, run.stderr
    handle = run.stdout.splitlines()[0]
    sleeps = wait_for_job_processes(handle, 2, ["sleep", "600"], timeout=180)
    assert "State: RUNNING" in _tx("status", handle).stdout
    assert _tx("cancel", handle).returncode == 0
    _, alive = psutil.wait_procs(sleeps, timeout=60)
    assert alive == []
    status = poll_until(lambda: _tx("status", handle).stdout, lambda s: "CANCELLED" in s, 60)
    assert "State: CANCELLED" in status, status


def test_progress_and_a_stall_reach_the_submitter_through_the_dashboard(submitter: Path) -> None:
    """Rank 0 reports a step, then hangs: the job's driver stops it as stalled and leaves
    the reason in the job's log, and another process (the CLI) reads it FAILED with the
    reason and the report, through the dashboard alone."""
    from torchx.runner import get_runner

    hangs = (
        "from torchx.trackers import report_progress\n"
        "report_progress(3, total=10)\nimport time; time.sleep(600)\n"
    )
    with get_runner(trackers={}) as runner:
        handle = runner.run_component("utils.python", ["--c", hangs], "ray", stall_timeout=5)
        status = runner.wait(handle, wait_interval=1, timeout=300)
        assert status is not None and status.state == specs.AppState.FAILED, status
        assert status.msg.startswith("stalled: no progress or output for 5 s"), status.msg
        report = runner.progress(handle)
        assert report is not None and (report.step, report.total) == (3, 10)
    status_line = _tx("status", handle).stdout
    assert "State: FAILED" in status_line and "stalled: no progress" in status_line
