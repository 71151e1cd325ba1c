"""The data model: upstream-compatible behaviour and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torchx import specs
from torchx.specs.api import _split_cfg_pairs


def test_upstream_usage_from_the_issue() -> None:
    app = specs.AppDef(
        name="train",
        roles=[
            specs.Role(
                name="trainer",
                image="/tmp",
                entrypoint="python",
                args=["train.py", "--lr", "0.1"],
                num_replicas=2,
                resource=specs.resource(h="gpu.small"),
            )
        ],
    )
    assert app.roles[0].resource == specs.Resource(cpu=8, gpu=1, memMB=32 * 1024)
    assert specs.parse_app_handle("local_cwd://torchx/train-abc") == specs.ParsedAppHandle(
        "local_cwd", "torchx", "train-abc"
    )
    assert specs.parse_app_handle("kubernetes:///ns:foo") == ("kubernetes", "", "ns:foo")
    assert specs.make_app_handle("slurm", "s", "12") == "slurm://s/12"


@pytest.mark.parametrize("bad", ["", "foo", "local_cwd://", "local_cwd://torchx/", "://x/y"])
def test_bad_handles(bad: str) -> None:
    with pytest.raises(specs.MalformedAppHandleException, match="SCHEDULER://SESSION/APP_ID"):
        specs.parse_app_handle(bad)


def test_macros_substitute_args_env_metadata_and_escape() -> None:
    role = specs.Role(
        name="r",
        image="img",
        entrypoint="x",
        args=["${app_id}", "$${app_id}", specs.macros.replica_id],
        env={"A": "${img_root}/x"},
        metadata={"k": ["${app_id}"], "n": {"m": "${replica_id}"}},
    )
    out = specs.macros.Values(
        img_root="/root", app_id="app-1", replica_id="3", rank0_env="R"
    ).apply(role)
    assert out.args == ["app-1", "${app_id}", "3"] and out.env == {"A": "/root/x"}
    assert out.metadata == {"k": ["app-1"], "n": {"m": "3"}}
    assert role.args[0] == "${app_id}"  # the original is untouched


def test_role_overrides_resolve_lazily() -> None:
    role = specs.Role(name="r", image="i", overrides={"entrypoint": lambda: "computed"})
    assert role.entrypoint == "computed"


def test_resource_copy_and_named_resources() -> None:
    r = specs.Resource.copy(specs.resource(cpu=2, memMB=100), foo="bar")
    assert r.capabilities == {"foo": "bar"} and r.cpu == 2
    assert specs.resource() == specs.Resource(2, 0, 1024)
    assert (
        specs.get_named_resources("aws_p3_2xlarge").capabilities["node.kubernetes.io/instance-type"]
        == "p3.2xlarge"
    )
    assert specs.named_resources["NULL"] == specs.NULL_RESOURCE
    with pytest.raises(specs.NamedResourceNotFound, match="did you mean 'gpu.small'"):
        specs.resource(h="gpu.smal")


def test_states() -> None:
    assert (
        str(specs.AppState.RUNNING) == "RUNNING" and repr(specs.AppState.RUNNING) == "RUNNING (3)"
    )
    assert specs.is_terminal(specs.AppState.CANCELLED) and not specs.is_terminal(
        specs.AppState.RUNNING
    )


def test_app_status_format_json_and_raise() -> None:
    err = json.dumps(
        {
            "message": {
                "message": "Traceback...\nValueError: bad lr",
                "extraInfo": {"timestamp": "1700000000"},
            }
        }
    )
    status = specs.AppStatus(
        specs.AppState.FAILED,
        msg="replica t/1 exited with code 1",
        roles=[
            specs.RoleStatus(
                "t",
                [
                    specs.ReplicaStatus(0, specs.AppState.SUCCEEDED, "t", "h"),
                    specs.ReplicaStatus(1, specs.AppState.FAILED, "t", "h", err),
                ],
            )
        ],
    )
    text = status.format()
    assert "*t[0]:SUCCEEDED" in text and " t[1]:FAILED" in text and "ValueError: bad lr" in text
    assert status.to_json(["t"])["roles"][0]["replicas"][1]["state"] == "FAILED"
    assert status.error_summary().startswith("FAILED: ValueError: bad lr")
    with pytest.raises(specs.AppStatusError) as e:
        status.raise_for_status()
    assert e.value.status is status
    specs.AppStatus(specs.AppState.SUCCEEDED).raise_for_status()
    assert "AppStatus" in repr(status)


def test_runopts() -> None:
    opts = specs.runopts()
    opts.add("queue", str, "the queue", required=True)
    opts.add("n", int, "count", default=1)
    opts.add("tags", list, "tags")
    opts.add("labels", dict, "labels")
    opts.add("flag", bool, "flag", default=False)
    cfg = opts.cfg_from_str("queue=q,n=3,tags=a;b,labels=k:v;k2:v2,flag=True")
    assert cfg == {
        "queue": "q",
        "n": 3,
        "tags": ["a", "b"],
        "labels": {"k": "v", "k2": "v2"},
        "flag": True,
    }
    assert opts.resolve({"queue": "q"})["n"] == 1
    with pytest.raises(specs.InvalidRunConfigException, match="Required run option 'queue'"):
        opts.resolve({})
    with pytest.raises(specs.InvalidRunConfigException, match="must be of type int"):
        opts.resolve({"queue": "q", "n": "three"})
    with pytest.raises(specs.InvalidRunConfigException, match="Unknown run option 'nope'"):
        opts.cfg_from_str("nope=1")
    with pytest.raises(specs.InvalidRunConfigException, match="must be of type int"):
        opts.cfg_from_str("n=x")
    with pytest.raises(TypeError):
        opts.add("bad", int, "x", default="1")
    with pytest.raises(ValueError):
        opts.add("bad", int, "x", default=1, required=True)
    assert opts.cfg_from_json_repr('{"tags": ["x"], "n": 2}') == {"tags": ["x"], "n": 2}
    assert "queue=QUEUE" in repr(opts) and "required arguments" in repr(opts)
    assert _split_cfg_pairs("a=1,b=x,y") == [("a", "1"), ("b", "x,y")]


def test_parse_mounts() -> None:
    mounts = specs.parse_mounts(
        [
            "type=bind,src=/a,dst=/b,readonly",
            "type=volume",
            "src=v",
            "dst=/c",
            "type=device,src=/dev/fuse",
        ]
    )
    assert mounts == [
        specs.BindMount("/a", "/b", True),
        specs.VolumeMount("v", "/c", False),
        specs.DeviceMount("/dev/fuse", "/dev/fuse", "rwm"),
    ]
    with pytest.raises(specs.InvalidArgumentError, match="unknown mount type"):
        specs.parse_mounts(["type=nfs,src=a,dst=b"])
    with pytest.raises(specs.InvalidArgumentError, match="missing dst="):
        specs.parse_mounts(["type=bind,src=/a"])


def test_star_import_and_cheap_import() -> None:
    code = (
        "import sys\n"
        "import torchx.specs\n"
        "heavy = [m for m in ('docstring_parser', 'yaml', 'torchx.specs.builders', 'mlflow',"
        " 'airflow', 'kubernetes', 'torch', 'importlib.metadata') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    star = subprocess.run(
        [sys.executable, "-c", "from torchx.specs import *; print(AppDef, materialize_appdef)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert star.returncode == 0 and "AppDef" in star.stdout, star.stderr
