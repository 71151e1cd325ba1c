"""Builtin components and the component rules (parsing, discovery, validation)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Optional

import pytest

import torchx.specs as specs
from torchx.apps.utils import copy_main
from torchx.components import dist, utils
from torchx.runtime.tracking import FsspecResultTracker
from torchx.specs.builders import ComponentArgumentError, component_help, materialize_appdef
from torchx.specs.finder import (
    ComponentNotFoundException,
    ComponentValidationException,
    get_component,
    get_components,
)


def test_echo_touch_sh_python_binary_copy() -> None:
    assert utils.echo(msg="x").roles[0].args == ["x"]
    assert utils.touch("f").roles[0].entrypoint == "touch"
    sh = utils.sh("echo", "$HOME", "a b", env={"A": "1"}).roles[0]
    assert sh.args == ["-c", "echo '$HOME' 'a b'"] and sh.env["A"] == "1" and "LOGLEVEL" in sh.env
    py = utils.python("--x", m="pkg.mod").roles[0]
    assert py.args == ["-m", "pkg.mod", "--x"] and py.env == {"HYDRA_MAIN_MODULE": "pkg.mod"}
    with pytest.raises(specs.InvalidArgumentError, match="exactly one"):
        utils.python(m="a", script="b.py")
    assert utils.binary("a", entrypoint="/bin/x").roles[0].image == specs.NONE
    assert utils.copy("a", "b").roles[0].args[-4:] == ["--src", "a", "--dst", "b"]


def test_ddp_command_and_elastic_j() -> None:
    app = dist.ddp("--lr", "0.1", script="train.py", j="1:3x2", max_restarts=2, rdzv_port=29501)
    role = app.roles[0]
    assert (role.min_replicas, role.num_replicas, role.name, app.name) == (1, 3, "train", "train")
    cmd = role.args[1]
    assert role.entrypoint == "bash" and role.args[0] == "-c"
    for part in (
        "--nnodes 1:3",
        "--nproc_per_node 2",
        "--max_restarts 2",
        "--rdzv_id '${app_id}'",
        "--rdzv_endpoint $${${rank0_env}:=localhost}:29501",
        "last_call_timeout=3",
        "train.py --lr 0.1",
    ):
        assert part in cmd, part
    assert role.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    single = dist.ddp(m="pkg.train", j="4").roles[0]
    assert (
        "--rdzv_endpoint localhost:0" in single.args[1]
        and single.name == "train"
        and single.min_replicas == 1
    )


@pytest.mark.parametrize("j", ["abc", "0x2", "3:2x1", "2x0", "x2", "1:0x2", "", "10001x1"])
def test_bad_j(j: str) -> None:
    with pytest.raises(specs.InvalidArgumentError, match="-j"):
        dist.ddp(script="t.py", j=j)


@pytest.mark.parametrize(
    "j, needle",
    [
        ("1x99999999999999999999", "at most 1,024 processes per node"),
        ("1x1025", "at most 1,024 processes per node"),
        ("2:4x" + "9" * 5000, "at most 1,024 processes per node"),  # past int()'s digit limit
        ("99999999999999999999x1", "at most 10,000 nodes"),
        ("1:10001x1", "at most 10,000 nodes"),
    ],
)
def test_j_upper_bounds(j: str, needle: str) -> None:
    with pytest.raises(specs.InvalidArgumentError, match=needle) as e:
        dist.ddp(script="t.py", j=j)
    assert "\n" not in str(e.value)
    with pytest.raises(specs.InvalidArgumentError, match=needle):
        dist.spmd(script="t.py", j=j)
    assert dist.parse_nnodes("10000x1024") == (10_000, 10_000, 1_024, "10000")
    assert dist.parse_nnodes("1:10000x0001")[:3] == (1, 10_000, 1)


def test_parse_nnodes_and_role_name_as_upstream() -> None:
    assert dist.parse_nnodes("1:2x4") == (1, 2, 4, "1:2")
    assert dist.parse_nnodes("2x4") == (2, 2, 4, "2")
    assert dist.parse_nnodes("4") == (1, 1, 4, "1")
    assert dist.parse_nnodes("10000x1")[1] == 10_000
    with pytest.raises(ValueError, match="-j"):
        dist.parse_nnodes("1x2x3")
    assert dist.get_role_name("path/to/train.py", None) == "train"
    assert dist.get_role_name(None, "pkg.mod.main") == "main"
    with pytest.raises(ValueError):
        dist.get_role_name(None, None)


def test_huge_replica_counts_are_refused_before_the_dryrun(tmp_path: Path) -> None:
    torchx_bin = str(Path(sys.executable).parent / "torchx")
    for args, needle in [
        (["dist.ddp", "-j", "100000x1", "--script", "t.py"], "at most 10,000 nodes"),
        (["utils.echo", "--num_replicas", "100000"], "at most 10,000 replicas"),
    ]:
        p = subprocess.run(
            [torchx_bin, "run", "--dryrun", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 1 and p.stdout == "", p.stdout[:200]
        assert p.stderr.count("\n") == 1 and needle in p.stderr, p.stderr
    with pytest.raises(specs.InvalidArgumentError, match="--num_replicas 0"):
        utils.sh("true", num_replicas=0)
    with pytest.raises(specs.InvalidArgumentError, match="--num_replicas 10001"):
        utils.python(m="x", num_replicas=10_001)
    with pytest.raises(specs.InvalidArgumentError, match="--num_replicas 0"):
        utils.binary(entrypoint="x", num_replicas=0)


def test_booth_as_upstream() -> None:
    role = utils.booth(1.5, 2, trial_idx=3, tracker_base="memory://b").roles[0]
    assert role.entrypoint == "python" and role.args == [
        "-m",
        "torchx.apps.utils.booth_main",
        "--x1",
        "1.5",
        "--x2",
        "2",
        "--trial_idx",
        "3",
        "--tracker_base",
        "memory://b",
    ]
    assert role.resource == specs.Resource(1, 0, 1024) and role.name == "torchx-utils-booth"


def test_spmd_infers_nproc_from_gpus() -> None:
    assert (
        "--nproc_per_node 8"
        in dist.spmd(script="t.py", h="aws_p4d.24xlarge", j="2").roles[0].args[1]
    )
    with pytest.raises(specs.InvalidArgumentError, match="GPU host"):
        dist.spmd(script="t.py", h="cpu.small", j="2")


def test_parsing_types_lists_dicts_bools_varargs() -> None:
    def comp(
        *args: str,
        n: int = 1,
        f: float = 0.5,
        flag: bool = False,
        tags: Optional[List[str]] = None,
        env: Optional[Dict[str, str]] = None,
        x: int | None = None,
        y: None | str = None,
    ) -> specs.AppDef:
        return specs.AppDef(
            "c",
            [
                specs.Role(
                    "r", "i", entrypoint="e", args=[repr((args, n, f, flag, tags, env, x, y))]
                )
            ],
        )

    app = materialize_appdef(
        comp,
        [
            "-n",
            "3",
            "-f",
            "1.5",
            "--flag",
            "TRUE",
            "--tags",
            "a,b",
            "--env",
            "A=1,B=x,y",
            "-x",
            "7",
            "-y",
            "s",
            "--",
            "--not-a-flag",
            "v",
        ],
    )
    assert app.roles[0].args[0] == repr(
        (("--not-a-flag", "v"), 3, 1.5, True, ["a", "b"], {"A": "1", "B": "x,y"}, 7, "s")
    )
    with pytest.raises(ComponentArgumentError, match="expected True or False"):
        materialize_appdef(comp, ["--flag", "maybe"])
    assert materialize_appdef(comp, [], config={"n": 5}).roles[0].args[0].startswith("((), 5,")
    with pytest.raises(ComponentArgumentError, match="unknown argument"):
        materialize_appdef(comp, [], config={"zzz": 1})


def test_help_text() -> None:
    text = component_help(dist.ddp)
    assert (
        "Distributed data parallel" in text and "--max_restarts" in text and "(default: 0)" in text
    )
    required = component_help(utils.touch)
    assert "--file str" in required and "(required)" in required


def test_discovery_and_errors(tmp_path: Path) -> None:
    names = set(get_components())
    assert {
        "utils.echo",
        "utils.sh",
        "utils.python",
        "utils.copy",
        "dist.ddp",
        "dist.spmd",
    } <= names
    with pytest.raises(ComponentNotFoundException, match="did you mean utils.echo"):
        get_component("utils.eco")
    f = tmp_path / "c.py"
    f.write_text(
        "import torchx.specs as specs\n"
        "def good(a: int = 1) -> specs.AppDef:\n    return specs.AppDef('x')\n"
        "def bad(**kw: str) -> specs.AppDef:\n    return specs.AppDef('x')\n"
        "def noret(a: int = 1):\n    return None\n"
    )
    assert get_component(f"{f}:good").fn.__name__ == "good"
    with pytest.raises(
        ComponentNotFoundException, match="has no function 'goo'; did you mean good"
    ):
        get_component(f"{f}:goo")
    with pytest.raises(ComponentValidationException, match=r"\*\*kwargs are not supported"):
        get_component(f"{f}:bad")
    with pytest.raises(ComponentValidationException, match="noret missing return annotation"):
        get_component(f"{f}:noret")


def test_entry_point_components_add_to_builtins(tmp_path: Path) -> None:
    pkg = tmp_path / "myco"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import torchx.specs as specs\ndef hello() -> specs.AppDef:\n    return specs.AppDef('h')\n"
    )
    dist_info = tmp_path / "myco-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: myco\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text("[torchx.components]\nmine = myco\n")
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        from torchx.specs.finder import get_components
        names = set(get_components())
        print("mine.hello" in names, "utils.echo" in names)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True"], out.stderr


def test_copy_main_between_filesystems(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    src.write_text("payload")
    assert copy_main.main(["--src", str(src), "--dst", "memory://x/b.txt"]) == 0
    assert copy_main.main(["--src", "memory://x/b.txt", "--dst", str(tmp_path / "c.txt")]) == 0
    assert (tmp_path / "c.txt").read_text() == "payload"
    assert copy_main.main(["--src", str(tmp_path / "missing"), "--dst", "memory://y"]) == 1


def test_booth_runs_and_writes_its_trial_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from torchx.runner import get_runner

    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    with get_runner(trackers={}) as runner:
        handle = runner.run_component(
            "utils.booth",
            ["--x1", "1", "--x2", "3", "--trial_idx", "7", "--tracker_base", str(tmp_path / "hpo")],
            "local_cwd",
        )
        status = runner.wait(handle, wait_interval=1, timeout=120)
        assert status is not None and str(status.state) == "SUCCEEDED", status
        assert "booth(1.0, 3.0) = 0.0\n" in list(runner.log_lines(handle, "torchx-utils-booth"))
    assert json.loads((tmp_path / "hpo" / "7").read_text()) == {"booth_eval": 0.0}
    assert FsspecResultTracker(str(tmp_path / "hpo"))[7] == {"booth_eval": 0.0}


def test_ddp_role_name_from_a_script_name_that_is_no_valid_role_name() -> None:
    assert dist.ddp(script="my dir/my script.py").roles[0].name == "my_script"
    assert dist.ddp(script="train.py").roles[0].name == "train"
    assert dist.ddp(script="./.hidden run!.py").roles[0].name == "hidden_run_"
    assert dist.ddp(m="pkg.my mod").roles[0].name == "my_mod"
    # the user's own file name still reaches torchrun unchanged
    assert "'my dir/my script.py'" in dist.ddp(script="my dir/my script.py").roles[0].args[1]
