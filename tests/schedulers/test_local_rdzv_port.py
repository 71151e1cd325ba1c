"""Multi-node ``dist.ddp`` jobs on local_cwd rendezvous on a free port of their own (not a
fixed 29500), so two jobs at once on one host both run; a port the user set is kept."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, List

import pytest

from torchx import specs
from torchx.components import dist
from torchx.runner import get_runner
from torchx.schedulers.local_scheduler import create_scheduler
from torchx.schedulers.ports import free_port

# Each worker waits until the workers of both jobs are up (files in SYNC) before its
# all_reduce: the two jobs' rendezvous stores are certainly up at the same time.
ALLREDUCE = """\
import os, sys, time
import torch, torch.distributed as dist
sync, tag = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
open(os.path.join(sync, f"{tag}-{dist.get_rank()}"), "w").close()
deadline = time.monotonic() + 60
while len(os.listdir(sync)) < 4:
    if time.monotonic() > deadline:
        sys.exit(f"the other job's workers never started: {sorted(os.listdir(sync))}")
    time.sleep(0.1)
t = torch.ones(1)
dist.all_reduce(t)
print(f"{tag} rank {dist.get_rank()}/{dist.get_world_size()} sum {t.item():g}", flush=True)
dist.destroy_process_group()
"""


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _endpoint_ports(app: specs.AppDef) -> List[int]:
    """The rendezvous port each replica's command line names, from a local_cwd dry run."""
    scheduler = create_scheduler("test")
    try:
        info = scheduler.submit_dryrun(app, {})
    finally:
        scheduler.close()
    ports = []
    for params in info.request.role_params.values():
        for param in params:
            (m,) = re.findall(r"--rdzv_endpoint \S*:(\d+)", " ".join(param.args))
            ports.append(int(m))
    return ports


def test_two_dry_runs_of_a_multi_node_ddp_get_different_free_ports() -> None:
    first = _endpoint_ports(dist.ddp(script="train.py", j="2x1"))
    second = _endpoint_ports(dist.ddp(script="train.py", j="2x1"))
    # both replicas of a job meet on one port; the two jobs on two, neither torchrun's 29500
    assert len(set(first)) == 1 and len(set(second)) == 1, (first, second)
    assert first[0] != second[0]
    assert 29500 not in first + second
    # an elastic job too
    (elastic,) = set(_endpoint_ports(dist.ddp(script="train.py", j="1:2x1")))
    assert elastic not in (first[0], second[0], 29500)


def test_roles_of_one_app_get_a_port_each() -> None:
    role = dist.ddp(script="train.py", j="2x1").roles[0]
    other = specs.Role(**{**role.__dict__, "name": "other"})
    ports = _endpoint_ports(specs.AppDef(name="two", roles=[role, other]))
    assert len(ports) == 4 and len(set(ports)) == 2, ports


@pytest.mark.parametrize("port", [29500, 29611])
def test_a_port_the_user_set_is_kept(port: int) -> None:
    assert _endpoint_ports(dist.ddp(script="train.py", j="2x1", rdzv_port=port)) == [port, port]


def test_a_single_node_job_keeps_torchruns_own_free_port() -> None:
    app = dist.ddp(script="train.py", j="1x2")
    assert "--rdzv_endpoint localhost:0" in app.roles[0].args[1]
    assert specs.macros.rdzv_port not in app.roles[0].args[1]


def test_other_schedulers_still_fill_in_29500() -> None:
    role = dist.ddp(script="train.py", j="2x1").roles[0]
    assert role.port_map == {"c10d": 29500}
    values = specs.macros.Values(img_root="", app_id="a", replica_id="0", rank0_env="R")
    assert "--rdzv_endpoint ${R:=localhost}:29500 " in values.apply(role).args[1]


def test_free_ports_are_not_handed_out_twice_in_a_row() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50


def test_two_multi_node_ddp_jobs_at_once_both_succeed(tmp_path: Path) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    sync = tmp_path / "sync"
    sync.mkdir()
    with get_runner() as runner:
        handles = [
            runner.run_component(
                "dist.ddp",
                ["-j", "2x1", "--rdzv_timeout", "60", "--script", str(script), str(sync), tag],
                "local_cwd",
            )
            for tag in ("a", "b")
        ]
        both_reduce(runner, handles, sync, timeout=180)


def both_reduce(runner: Any, handles: List[str], sync: Path, timeout: float) -> None:
    """The two jobs ``a`` and ``b`` SUCCEED, each rank having summed over its own job."""
    try:
        statuses = [runner.wait(h, wait_interval=0.2, timeout=timeout) for h in handles]
        logs = {
            h: [line for k in range(2) for line in runner.log_lines(h, "allreduce", k)]
            for h in handles
        }
    finally:
        for h in handles:
            runner.cancel(h)
    states = [s.state if s else None for s in statuses]
    assert states == [specs.AppState.SUCCEEDED] * 2, (statuses, logs)
    assert sorted(p.name for p in sync.iterdir()) == ["a-0", "a-1", "b-0", "b-1"]
    sums = sorted(x.strip() for lines in logs.values() for x in lines if " sum " in x)
    assert [s.split("]:")[-1] for s in sums] == [
        f"{tag} rank {r}/2 sum 2" for tag in ("a", "b") for r in range(2)
    ], logs
