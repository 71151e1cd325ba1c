"""``torchx torchrun``: torchrun's own command line, run as real processes side by side with
plain ``torchrun``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import psutil
import pytest
import yaml

from tests.cli.test_cli import AS_FROM_A_TERMINAL
from tests.mlflow_server import free_port
from tests.polling import poll_until
from tests.processes import wait_for_job_processes
from tests.schedulers.test_slurm_scheduler import cluster  # noqa: F401  (the fixture)

BIN = os.path.dirname(sys.executable)
TORCHX = os.path.join(BIN, "torchx")
TORCHRUN = os.path.join(BIN, "torchrun")

ARGS_SCRIPT = "import os, sys\nprint('rank', os.environ['RANK'], 'args', sys.argv[1:])\n"
FAILING_SCRIPT = (
    "import os\n"
    "print('rank', os.environ['RANK'], 'up', flush=True)\n"
    "if os.environ['RANK'] == '1':\n"
    "    raise ValueError('rank 1 broke')\n"
)


def _run(cmd: List[str], env: dict, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_both_ranks_get_the_scripts_args_prefixed(env: dict, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(ARGS_SCRIPT)
    argv = ["--nnodes", "1", "--nproc_per_node", "2", "train.py", "--x", "1"]
    p = _run([TORCHX, "torchrun", *argv], env, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("local_cwd://torchx/train-")
    # node train/0 (torchx's prefix), then torchrun's local rank
    assert "train/0 [0]:rank 0 args ['--x', '1']" in lines, lines
    assert "train/0 [1]:rank 1 args ['--x', '1']" in lines, lines
    status = _run([TORCHX, "status", lines[0]], env, tmp_path)
    assert "SUCCEEDED" in status.stdout


def test_a_failing_rank_exits_as_plain_torchrun(env: dict, tmp_path: Path) -> None:
    (tmp_path / "fail.py").write_text(FAILING_SCRIPT)
    # --standalone: a free port for plain torchrun's store (its default, 29500, may be taken)
    argv = ["--standalone", "--nproc_per_node", "2", "fail.py"]
    plain = _run([TORCHRUN, *argv], env, tmp_path)
    ours = _run([TORCHX, "torchrun", *argv], env, tmp_path)
    assert plain.returncode != 0 and ours.returncode == plain.returncode, (plain, ours)
    assert "ValueError: rank 1 broke" in plain.stderr
    assert "fail/0 [1]:ValueError: rank 1 broke" in ours.stdout.splitlines()
    (error,) = ours.stderr.strip().splitlines()
    assert "FAILED" in error and "Traceback" not in ours.stderr


def test_elastic_line_is_the_dist_ddp_app(env: dict, tmp_path: Path) -> None:
    def application(args: List[str]) -> str:
        p = _run([TORCHX, *args], env, tmp_path)
        assert p.returncode == 0, p.stderr
        return p.stdout.split("=== SCHEDULER REQUEST ===")[0]

    ours = application(
        ["torchrun", "--dryrun", "--nnodes", "1:2", "--nproc_per_node", "2"]
        + ["--max_restarts", "2", "train.py", "--lr", "0.1"]
    )
    ddp = application(
        ["run", "--dryrun", "dist.ddp", "-j", "1:2x2", "--max_restarts", "2"]
        + ["--script", "train.py", "--", "--lr", "0.1"]
    )
    assert ours == ddp
    assert "'min_replicas': 1" in ours and "'num_replicas': 2" in ours
    assert "--nnodes 1:2 --nproc_per_node 2 --max_restarts 2" in ours


def test_unknown_flag_is_torchruns_usage_error(env: dict, tmp_path: Path) -> None:
    plain = _run([TORCHRUN, "--bogus", "1", "train.py"], env, tmp_path)
    ours = _run([TORCHX, "torchrun", "--bogus", "1", "train.py"], env, tmp_path)
    assert ours.returncode == plain.returncode == 2
    # the same message from the same flags (torchrun prints its usage first, torchx one line)
    assert plain.stderr.endswith("torchrun: error: unrecognized arguments: --bogus\n")
    (line,) = ours.stderr.strip().splitlines()
    assert line.startswith("torchx torchrun: error: unrecognized arguments: --bogus (see")
    assert not (tmp_path / "home" / "local_cwd").exists()


def test_dryrun_on_kubernetes_shows_torchruns_flags(env: dict, tmp_path: Path) -> None:
    p = _run(
        [TORCHX, "torchrun", "-s", "kubernetes", "-cfg", "queue=default", "--dryrun"]
        + ["--workspace", "", "--image", "ghcr.io/me/train:1", "--cpu", "8", "--nnodes", "2"]
        + ["--nproc_per_node", "4", "--max_restarts", "3", "--monitor_interval", "0.5"]
        + ["train.py", "--lr", "0.1"],
        env,
        tmp_path,
    )
    assert p.returncode == 0, p.stderr
    job = yaml.safe_load(p.stdout.split("=== SCHEDULER REQUEST ===")[1])
    assert job["kind"] == "Job" and job["spec"]["minAvailable"] == 2
    for task in job["spec"]["tasks"]:
        (container,) = task["template"]["spec"]["containers"]
        command = container["command"][-1]
        assert "--nnodes 2 --nproc_per_node 4 --max_restarts 3" in command
        assert command.endswith("train.py --lr 0.1")
        assert container["image"] == "ghcr.io/me/train:1"
        assert container["resources"]["limits"]["cpu"] == "8000m"
        assert {"name": "PET_MONITOR_INTERVAL", "value": "0.5"} in container["env"]


def test_no_python_runs_a_program(env: dict, tmp_path: Path) -> None:
    p = _run(
        [TORCHX, "torchrun", "--nproc_per_node", "2", "--no_python", "sh", "-c", "echo r$RANK"],
        env,
        tmp_path,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert {"sh/0 [0]:r0", "sh/0 [1]:r1"} <= set(p.stdout.splitlines()), p.stdout


def test_without_torch_one_line(env: dict, tmp_path: Path) -> None:
    hide_torch = (
        "import sys; sys.modules['torch'] = None; from torchx.cli.main import main;"
        " main(['torchrun', '--nproc_per_node', '2', 'train.py'])"
    )
    p = _run([sys.executable, "-c", hide_torch], env, tmp_path)
    assert p.returncode == 1
    (line,) = p.stderr.strip().splitlines()
    assert "torch, which is not installed" in line and "pip install torch" in line


def test_ctrl_c_cancels_the_job(env: dict, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", AS_FROM_A_TERMINAL, TORCHX, "torchrun"]
        + ["--nproc_per_node", "2", "--no_python", "sleep", "600"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    handle = proc.stdout.readline().strip()
    sleeps = wait_for_job_processes(handle, 2, ["sleep", "600"], timeout=120)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err
    _, alive = psutil.wait_procs(sleeps, timeout=60)
    assert not alive
    assert "CANCELLED" in _run([TORCHX, "status", handle], env, tmp_path).stdout


# a shell script that starts a command in the background as a script would (`cmd &`: the
# shell sets SIGINT to SIG_IGN in it), waits for the test's go, sends it SIGINT and records
# its exit code; every wait has a deadline
BACKGROUND = """
"$@" > out 2> err &
pid=$!
echo $pid > pid
for _ in $(seq 3000); do [ -e go ] && break; sleep 0.1; done
kill -INT $pid
wait $pid
echo $? > rc
"""


def _kill_int_in_background(cmd: List[str], env: dict, tmp_path: Path, count: int) -> str:
    """Run ``cmd`` as ``cmd &`` from bash, send it SIGINT once its job's ``count`` sleeps
    run, and check that it cancelled the job and exited 130, as plain torchrun does."""
    shell = subprocess.Popen(["bash", "-c", BACKGROUND, "bash", *cmd], env=env, cwd=tmp_path)
    out, rc = tmp_path / "out", tmp_path / "rc"
    try:
        handle = poll_until(
            lambda: out.read_text().split("\n")[0] if out.exists() else "",
            lambda line: "://" in line,
            timeout=120,
        )
        assert "://" in handle, (out.read_text(), (tmp_path / "err").read_text())
        sleeps = wait_for_job_processes(handle, count, ["sleep", "600"], timeout=120)
        (tmp_path / "go").touch()
        code = poll_until(lambda: rc.read_text() if rc.exists() else "", bool, timeout=120)
    finally:
        (tmp_path / "go").touch()
        if not rc.exists() and (tmp_path / "pid").exists():  # it ignored SIGINT: stop it
            os.kill(int((tmp_path / "pid").read_text()), signal.SIGTERM)
        shell.wait(timeout=120)
    err = (tmp_path / "err").read_text()
    assert code.strip() == "130", err
    assert "Traceback" not in err and "cancelled" in err, err
    _, alive = psutil.wait_procs(sleeps, timeout=60)
    assert not alive
    return handle


def test_kill_int_from_a_script_cancels_a_background_run(env: dict, tmp_path: Path) -> None:
    argv = ["--nproc_per_node", "2", "--no_python", "sleep", "600"]
    handle = _kill_int_in_background([TORCHX, "torchrun", *argv], env, tmp_path, 2)
    assert "CANCELLED" in _run([TORCHX, "status", handle], env, tmp_path).stdout


@pytest.mark.slurm
def test_wait_on_slurm_streams_and_exits_with_the_jobs_code(
    cluster: None,  # noqa: F811
    env: dict,
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text(ARGS_SCRIPT)
    (tmp_path / "fail.py").write_text(FAILING_SCRIPT)
    on_slurm = [TORCHX, "torchrun", "-s", "slurm", "--wait", "--nnodes", "1"]
    on_slurm += ["--nproc_per_node", "2", "--rdzv_endpoint", f"localhost:{free_port()}"]
    ok = _run([*on_slurm, "train.py", "--x", "1"], env, tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = ok.stdout.splitlines()
    assert lines[0].startswith("slurm://torchx/"), lines
    assert "rank 1 args ['--x', '1']" in ok.stdout, ok.stdout  # streamed
    assert "SUCCEEDED" in _run([TORCHX, "status", lines[0]], env, tmp_path).stdout

    plain = _run([TORCHRUN, "--standalone", "--nproc_per_node", "2", "fail.py"], env, tmp_path)
    failed = _run([*on_slurm, "fail.py"], env, tmp_path)
    assert failed.returncode == plain.returncode != 0, (plain, failed)  # as torchrun's
    assert "ValueError: rank 1 broke" in failed.stdout, failed.stdout
    (error,) = failed.stderr.strip().splitlines()
    assert "FAILED" in error, failed.stderr


@pytest.mark.slurm
def test_kill_int_cancels_a_waited_slurm_job(
    cluster: None,  # noqa: F811
    env: dict,
    tmp_path: Path,
) -> None:
    cmd = [TORCHX, "torchrun", "-s", "slurm", "--wait", "--nproc_per_node", "1"]
    cmd += ["--rdzv_endpoint", f"localhost:{free_port()}", "--no_python", "sleep", "600"]
    handle = _kill_int_in_background(cmd, env, tmp_path, 1)
    status = poll_until(
        lambda: _run([TORCHX, "status", handle], env, tmp_path).stdout,
        lambda out: "CANCELLED" in out,
        timeout=120,
    )
    assert "CANCELLED" in status, status


@pytest.mark.slurm
def test_submits_to_slurm(cluster: None, env: dict, tmp_path: Path) -> None:  # noqa: F811
    (tmp_path / "train.py").write_text(ARGS_SCRIPT)
    p = _run(
        [TORCHX, "torchrun", "-s", "slurm", "--nnodes", "2", "--nproc_per_node", "1"]
        + ["--rdzv_endpoint", f"localhost:{free_port()}", "train.py", "--x", "1"],
        env,
        tmp_path,
    )
    assert p.returncode == 0, p.stderr
    (handle,) = p.stdout.splitlines()  # submitted, not waited on
    assert handle.startswith("slurm://torchx/")
    deadline = time.monotonic() + 300
    status = ""
    while time.monotonic() < deadline:
        status = _run([TORCHX, "status", handle], env, tmp_path).stdout
        if any(s in status for s in ("SUCCEEDED", "FAILED", "CANCELLED")):
            break
        time.sleep(1)
    assert "SUCCEEDED" in status, status
    lines = _run([TORCHX, "log", handle], env, tmp_path).stdout.splitlines()
    ranks = sorted(line.split(" ", 1)[1] for line in lines if " args " in line)
    assert ranks == ["[0]:rank 0 args ['--x', '1']", "[0]:rank 1 args ['--x', '1']"], lines
