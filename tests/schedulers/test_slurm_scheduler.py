"""Slurm: parsers against recorded 22.05 and 24.x outputs.

The scheduler is tested against a real local cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.processes import wait_for_job_processes
from torchx import specs
from torchx.components import utils
from torchx.schedulers.slurm_scheduler import create_scheduler, parse_jobcomp, parse_squeue

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
ROOT = Path(__file__).resolve().parents[2]
TORCHX = os.path.join(os.path.dirname(sys.executable), "torchx")


@pytest.mark.parametrize(
    "fixture", ["squeue_22.05_hetjob_failed.json", "squeue_24.11_hetjob_failed.json"]
)
def test_squeue_json_of_both_versions(fixture: str) -> None:
    data = json.loads((FIXTURES / fixture).read_text())
    leader = max(
        int(j["het_job_id"]["number"] if isinstance(j["het_job_id"], dict) else j["het_job_id"])
        for j in data["jobs"]
    )
    parts = parse_squeue(data, str(leader))
    assert [(p["name"], p["state"], p["exit_code"], p["offset"], p["node"]) for p in parts] == [
        ("w-0", "FAILED", 0, 0, "node1"),
        ("w-1", "FAILED", 3, 1, "node2"),
    ]


def test_jobcomp_fallback() -> None:
    parts = parse_jobcomp((FIXTURES / "jobcomp_22.05.txt").read_text(), "1")
    assert [(p["name"], p["state"], p["exit_code"]) for p in parts] == [
        ("w-0", "FAILED", 0),
        ("w-1", "FAILED", 3),
    ]


def test_dryrun_script_is_a_hetjob_with_rank0_host() -> None:
    app = utils.sh("echo", "$x", num_replicas=2, cpu=2, memMB=500)
    info = create_scheduler("torchx").submit_dryrun(app, {"partition": "debug", "time": "1:00"})
    script = info.request.materialize()
    assert script.count("#SBATCH --job-name=sh-") == 2 and "#SBATCH hetjob" in script
    assert "--cpus-per-task=2 --mem=500 --partition=debug --time=1:00" in script
    assert "--het-group=1" in script and "export TORCHX_RANK0_HOST=" in script
    assert '--output=slurm-"$SLURM_JOB_ID"-sh-1.out' in script
    assert "'echo '\"'\"'$x'\"'\"''" in script  # the user's $x is not expanded by the batch script


# --------------------------------------------------------------------------- real cluster


@pytest.fixture(scope="module")
def cluster() -> None:
    if shutil.which("sinfo") is None:
        pytest.skip("Slurm is not installed (bash scripts/slurm_cluster.sh install && start)")
    if subprocess.run(["sinfo"], capture_output=True, timeout=30).returncode != 0:
        if os.geteuid() != 0:
            pytest.skip("no running Slurm cluster")
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "slurm_cluster.sh"), "start"], check=True, timeout=120
        )
        os.environ["SLURM_CONF"] = (
            os.environ.get("SLURM_CLUSTER_DIR", "/tmp/torchx-slurm") + "/slurm.conf"
        )


@pytest.fixture()
def env(cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TORCHX_TRACKERS", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _tx(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TORCHX, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ)
    )


def _wait_terminal(handle: str, timeout: float = 300) -> specs.AppStatus:
    from torchx.runner import get_runner

    with get_runner() as runner:
        status = runner.wait(handle, wait_interval=0.5, timeout=timeout)
    assert status is not None and status.is_terminal(), status
    return status


def test_job_failing_on_one_replica_reports_that_replica(env: Path) -> None:
    p = _tx(
        "run",
        "-s",
        "slurm",
        "utils.python",
        "--num_replicas",
        "2",
        "--c",
        "import os; r = os.environ['TORCHX_REPLICA_ID']; print('replica', r);"
        " assert r != '1', 'replica 1 broke'",
    )
    handle = p.stdout.splitlines()[0]
    status = _wait_terminal(handle)
    assert status.state == specs.AppState.FAILED
    states = [r.state for r in status.roles[0].replicas]
    assert states == [specs.AppState.SUCCEEDED, specs.AppState.FAILED]
    assert "AssertionError: replica 1 broke" in status.structured_error_msg
    assert "replica 0" in _tx("log", f"{handle}/python/0").stdout
    assert handle in _tx("list", "-s", "slurm").stdout


def test_single_replica_job(env: Path) -> None:
    p = _tx("run", "-s", "slurm", "--wait", "--log", "utils.echo", "--msg", "one")
    assert p.returncode == 0, p.stderr
    assert "echo/0 one" in p.stdout


def test_cancel_leaves_no_process(env: Path) -> None:
    handle = _tx(
        "run", "-s", "slurm", "utils.sh", "--num_replicas", "2", "sleep", "600"
    ).stdout.splitlines()[0]
    sleeps = wait_for_job_processes(handle, 2, ["sleep", "600"], timeout=60)
    assert "State: RUNNING" in _tx("status", handle).stdout
    assert _tx("cancel", handle).returncode == 0
    assert _wait_terminal(handle).state == specs.AppState.CANCELLED
    _, alive = psutil.wait_procs(sleeps, timeout=30)
    assert alive == []


@pytest.mark.slow
@pytest.mark.parametrize("j", ["2x1", "1:2x1"])
def test_reference_training_across_both_nodes(env: Path, j: str) -> None:
    data = env / "data"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "apps" / "datapreproc.py"),
            "--output_path",
            str(data),
            "--limit",
            "600",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    p = _tx(
        "run",
        "-s",
        "slurm",
        "--wait",
        "-cfg",
        f"job_dir={env / 'job'}",
        f"{ROOT}/examples/components.py:trainer",
        "--data_path",
        str(data),
        "--output_path",
        str(env / "model"),
        "--checkpoint_path",
        str(env / "ckpt"),
        "-j",
        j,
        "--epochs",
        "3",
        "--rdzv_port",
        "29811" if j == "2x1" else "29812",
        timeout=600,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    handle = p.stdout.splitlines()[0]
    status = _wait_terminal(handle)
    assert status.state == specs.AppState.SUCCEEDED
    assert [r.hostname for r in status.roles[0].replicas] == ["node1", "node2"]
    logs = _tx("log", handle).stdout
    assert "world_size=2" in logs and logs.count("wrote model to") == 1
    assert (env / "model" / "model.pt").exists()
