"""``torchrun_stage``: a pipeline stage written as its torchrun line, in each adapter's terms."""

# no `from __future__ import annotations`: KFP reads the pipeline function's annotations

from pathlib import Path

import pytest
import yaml

from torchx.pipelines.torchrun import TorchrunStage, torchrun_stage
from torchx.specs import InvalidArgumentError

LINE = "torchrun --nnodes 1:2 --nproc_per_node 2 --max_restarts 3 --cpu 3 train.py --lr '0.1 x'"
ARGS = ["-j", "1:2x2", "--max_restarts", "3", "--cpu", "3", "--script", "train.py"]


def test_a_line_or_a_list_with_or_without_torchrun() -> None:
    want = TorchrunStage("dist.ddp", [*ARGS, "--", "--lr", "0.1 x"])
    assert torchrun_stage(LINE) == want
    assert torchrun_stage(LINE.split(" ", 1)[1]) == want
    argv = ["/venv/bin/torchrun", *LINE.split()[1:10], "--lr", "0.1 x"]
    assert torchrun_stage(argv) == want
    with pytest.raises(InvalidArgumentError, match="unrecognized arguments: --bogus"):
        torchrun_stage("torchrun --bogus train.py")


def test_kfp_launcher_task_from_a_torchrun_line(tmp_path: Path) -> None:
    from kfp import compiler, dsl

    from torchx.pipelines.kfp import torchx_launcher

    @dsl.pipeline(name="torchrun-line")
    def pipeline() -> None:
        torchx_launcher(**torchrun_stage(LINE)._asdict(), scheduler="kubernetes")

    out = tmp_path / "p.yaml"
    compiler.Compiler().compile(pipeline, str(out))
    ir = yaml.safe_load(out.read_text())
    task = ir["root"]["dag"]["tasks"]["torchx-launcher"]["inputs"]["parameters"]
    assert task["component"]["runtimeValue"]["constant"] == "dist.ddp"
    assert task["component_args"]["runtimeValue"]["constant"][:8] == ARGS
    container = ir["deploymentSpec"]["executors"]["exec-torchx-launcher"]["container"]
    assert container["resources"]["resourceCpuLimit"] == "3"  # the app's, from --cpu 3
