"""Two multi-node ``dist.ddp`` jobs at once on ``local_docker`` (host network): each
rendezvous on a free port of its own, not torchrun's fixed 29500."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchx import specs
from torchx.runner import get_runner

from ..test_local_rdzv_port import ALLREDUCE


def test_two_multi_node_ddp_jobs_at_once_both_succeed(docker_client: Any, tmp_path: Path) -> None:
    (tmp_path / "allreduce.py").write_text(ALLREDUCE)
    sync = tmp_path / "sync"
    sync.mkdir()
    mount = f"type=bind,src={tmp_path},dst=/job"
    with get_runner() as runner:
        handles = [
            runner.run_component(
                "dist.ddp",
                [
                    "-j",
                    "2x1",
                    "--rdzv_timeout",
                    "60",
                    "--mounts",
                    mount,
                    "--script",
                    "/job/allreduce.py",
                    "/job/sync",
                    tag,
                ],
                "local_docker",
            )  # fmt: skip
            for tag in ("a", "b")
        ]
        try:
            statuses = [runner.wait(h, wait_interval=0.5, timeout=240) for h in handles]
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
