"""``torchx run -s slurm --workspace`` on the real local Slurm cluster (two nodes).

Skips until ``SlurmScheduler`` mixes in ``DirWorkspaceMixin``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.schedulers.test_slurm_scheduler import cluster  # noqa: F401  (the fixture)
from torchx.schedulers.slurm.scheduler import SlurmScheduler
from torchx.workspace import WorkspaceMixin

TORCHX = os.path.join(os.path.dirname(sys.executable), "torchx")

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        not issubclass(SlurmScheduler, WorkspaceMixin),
        reason="slurm does not mix in DirWorkspaceMixin yet",
    ),
]


def test_script_only_in_the_workspace_runs_on_both_nodes(
    cluster: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "only_here.sh").write_text(
        'echo "ran on $SLURMD_NODENAME: $(cat payload.txt)"\n'
        "test -e secret.txt && echo LEAKED || true\n"
    )
    (ws / "payload.txt").write_text("payload")
    (ws / "secret.txt").write_text("not for the cluster")
    (ws / ".torchxignore").write_text("secret.txt\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    job_dir = tmp_path / "job"
    args = ["run", "-s", "slurm", "--wait", "--log", "-cfg", f"job_dir={job_dir}"]
    args += ["--workspace", str(ws), "utils.sh", "--num_replicas", "2", "sh", "only_here.sh"]
    p = subprocess.run(
        [TORCHX, *args],
        cwd=elsewhere,
        env=dict(os.environ, TORCHX_HOME=str(tmp_path / "home")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout.splitlines()
    assert "sh/0 ran on node1: payload" in out and "sh/1 ran on node2: payload" in out, out
    assert "LEAKED" not in p.stdout
    assert (job_dir / "only_here.sh").exists() and not (job_dir / "secret.txt").exists()
    # an existing job_dir is refused in one line
    p = subprocess.run(
        [TORCHX, *args],
        cwd=elsewhere,
        env=dict(os.environ, TORCHX_HOME=str(tmp_path / "home")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1
    (line,) = p.stderr.strip().splitlines()
    assert f"job_dir {job_dir} already exists" in line and '--workspace ""' in line
