"""A torchrun command line as dist.ddp's arguments (torchx.components.torchrun), and
torchrun's flags read from torch's own parser (torchx.components.torchrun_flags)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from torchx.components import dist
from torchx.components.torchrun import parse
from torchx.components.torchrun_flags import torchrun_flags
from torchx.specs import AppDef, InvalidArgumentError
from torchx.specs.builders import materialize_appdef


def _ddp(args: List[str]) -> AppDef:
    return materialize_appdef(dist.ddp, args)


def test_flags_are_torchs_own() -> None:
    from torch.distributed.run import get_args_parser

    torch_options = {
        s for a in get_args_parser()._actions for s in a.option_strings if a.dest != "help"
    }
    ours = {s for f in torchrun_flags() for s in f.option_strings}
    assert ours == torch_options
    assert {"--nnodes", "--nproc_per_node", "--no_python", "--run_path", "-m"} <= ours


def test_script_args_and_resources_become_ddp_args() -> None:
    request = parse(
        ["--nnodes", "1", "--nproc_per_node", "2", "--cpu", "4", "-h", "gpu.small"]
        + ["train.py", "--x", "1", "--nnodes", "3"]
    )
    assert request.component == "dist.ddp" and request.script == "train.py"
    assert request.component_args == [
        "-j",
        "1x2",
        "--max_restarts",
        "0",
        "--h",
        "gpu.small",
        "--cpu",
        "4",
        "--script",
        "train.py",
        "--",
        "--x",
        "1",
        "--nnodes",
        "3",
    ]


def test_elastic_line_is_the_elastic_ddp_app() -> None:
    request = parse(["--nnodes", "1:2", "--nproc_per_node", "2", "--max_restarts", "2", "t.py"])
    want = _ddp(["-j", "1:2x2", "--max_restarts", "2", "--script", "t.py"])
    assert _ddp(request.component_args) == want
    role = want.roles[0]
    assert (role.min_replicas, role.num_replicas) == (1, 2)
    assert "--nnodes 1:2 --nproc_per_node 2 --max_restarts 2" in role.args[1]
    assert "--rdzv_backend c10d" in role.args[1]  # torchrun's default static is not elastic


def test_rendezvous_flags() -> None:
    multi = parse(
        ["--nnodes", "2", "--rdzv_backend", "c10d"] + ["--rdzv_endpoint", "h:29400", "t.py"]
    )
    assert multi.component_args[:6] == [
        "-j",
        "2x1",
        "--max_restarts",
        "0",
        "--rdzv_backend",
        "c10d",
    ]
    assert multi.component_args[6:8] == ["--rdzv_port", "29400"]
    static = parse(["--nnodes", "2", "--rdzv_backend", "static", "--master_port", "29411", "t.py"])
    assert ["--rdzv_port", "29411"] == static.component_args[6:8]
    assert "--node_rank '${replica_id}'" in _ddp(static.component_args).roles[0].args[1]
    standalone = parse(["--standalone", "--nproc_per_node", "4", "t.py"])
    assert standalone.component_args[:6] == ["-j", "1x4", "--max_restarts", "0"] + [
        "--rdzv_backend",
        "c10d",
    ]
    conf = parse(["--rdzv_conf", "join_timeout=9", "--tee", "1", "t.py"])
    app = _ddp(conf.component_args)
    assert "join_timeout=9," in app.roles[0].args[1] and "--tee 1" in app.roles[0].args[1]
    ids = parse(["--rdzv_id", "456", "--node_rank", "1", "--role", "r", "t.py"])
    assert [n.split(":")[0] for n in ids.ignored] == ["--rdzv_id 456", "--role r", "--node_rank 1"]


def test_other_flags_reach_the_jobs_torchrun_as_pet_env() -> None:
    request = parse(
        ["--no_python", "--monitor_interval", "0.5", "--env", "A=1", "--log-dir=/tmp/l"]
        + ["--duplicate_stdout_filters", "a,b", "echo", "hi"]
    )
    assert request.no_python and not request.module
    env = _ddp(request.component_args).roles[0].env
    assert env["A"] == "1" and env["PET_NO_PYTHON"] == "1"
    assert env["PET_MONITOR_INTERVAL"] == "0.5" and env["PET_LOG_DIR"] == "/tmp/l"
    assert env["PET_DUPLICATE_STDOUT_FILTERS"] == "a,b"
    # argparse reads the line as torchrun's parser does (its "--" is gone there too)
    module = parse(["-m", "pkg.train", "--", "--lr", "0.1"])
    assert module.module and module.component_args[-4:] == ["pkg.train", "--", "--lr", "0.1"]
    assert _ddp(module.component_args).roles[0].args[1].endswith("-m pkg.train --lr 0.1")


def test_torchruns_own_env_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_STANDALONE", "1")
    assert parse(["t.py"]).component_args[:6] == ["-j", "1x3", "--max_restarts", "0"] + [
        "--rdzv_backend",
        "c10d",
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--foo", "t.py"], "torchrun: unrecognized arguments: --foo"),
        (["--nproc_per_node", "auto", "t.py"], "give one (e.g. --nproc_per_node 2)"),
        (["--nnodes", "2x", "t.py"], "--nnodes 2x: give a number of nodes"),
        (
            ["--nproc_per_node", "99999999999999999999", "t.py"],
            "--nproc_per_node 99999999999999999999: at most 1,024 processes per node",
        ),
        (["--nproc_per_node", "1025", "t.py"], "at most 1,024 processes per node"),
        (["--nnodes", "1:10001", "t.py"], "--nnodes 1:10001: at most 10,000 nodes"),
        (["--nnodes", "9" * 5000, "t.py"], "at most 10,000 nodes"),
        (["--nproc_per_node", "\u00b2", "t.py"], "give one (e.g. --nproc_per_node 2)"),
        (["--standalone", "--nnodes", "2", "t.py"], "--standalone runs one node"),
        (["--rdzv_backend", "etcd", "t.py"], "--rdzv_backend etcd:"),
        (["--tee", "0:1,1:2", "t.py"], "one stream number"),
        (["-m", "--no_python", "t"], "don't use both"),
        (["--numa_binding", "node", "t.py"], "--numa_binding: torch reads it only from the"),
        (["--rdzv_endpoint", "h:port", "t.py"], "give HOST:PORT"),
        ([], "the following arguments are required: training_script"),
    ],
)
def test_bad_lines_raise_one_line(argv: List[str], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=None) as e:
        parse(argv)
    assert message in str(e.value) and "\n" not in str(e.value)


# a new process reads the flags: does it import torch?
_IMPORTS_TORCH = (
    "import sys; from torchx.components.torchrun import parse;"
    " r = parse(['--nproc_per_node', '2', 't.py']); assert r.component_args[1] == '1x2';"
    " print('torch' in sys.modules)"
)


def test_flags_are_read_from_torch_once_per_install(tmp_path: Path) -> None:
    env = dict(os.environ, TORCHX_HOME=str(tmp_path))
    env.pop("PET_NPROC_PER_NODE", None)

    def imports_torch() -> bool:
        p = subprocess.run(
            [sys.executable, "-c", _IMPORTS_TORCH], env=env, capture_output=True, text=True
        )
        assert p.returncode == 0, p.stderr
        return p.stdout.strip() == "True"

    assert imports_torch()  # the first reads torch's parser ...
    (cache,) = (tmp_path / "cache").iterdir()
    assert "--nproc-per-node" in json.dumps(json.loads(cache.read_text()))
    assert not imports_torch()  # ... later ones its description
    cache.write_text("{not json")  # a damaged description is read again from torch
    assert imports_torch() and not imports_torch()
