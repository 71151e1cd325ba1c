"""Two multi-node ``dist.ddp`` jobs at once on ``local_docker`` (host network): each
rendezvous on a free port of its own, not torchrun's fixed 29500."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchx.runner import get_runner

from ..test_local_rdzv_port import ALLREDUCE, both_reduce


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
        both_reduce(runner, handles, sync, timeout=240)
