"""The data model: upstream-compatible behaviour and clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from torchx import specs


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
        metadata={"k": ["${app_id}", {"v": "${app_id}"}], "n": {"m": "${replica_id}"}},
    )
    out = specs.macros.Values(
        img_root="/root", app_id="app-1", replica_id="3", rank0_env="R"
    ).apply(role)
    assert out.args == ["app-1", "${app_id}", "3"] and out.env == {"A": "/root/x"}
    assert out.metadata == {"k": ["app-1", {"v": "app-1"}], "n": {"m": "3"}}
    assert role.args[0] == "${app_id}"  # the original is untouched


def test_role_overrides_resolve_lazily() -> None:
    role = specs.Role(name="r", image="i", overrides={"entrypoint": lambda: "computed"})
    assert role.entrypoint == "computed"


def test_macro_values_give_every_replica_the_overrides() -> None:
    calls = []

    def args() -> list:
        calls.append(1)
        return ["--rank", "${replica_id}"]

    role = specs.Role(name="r", image="i", entrypoint="x", num_replicas=2, overrides={"args": args})
    replicas = [
        specs.macros.Values(img_root="", app_id="a", replica_id=str(i), rank0_env="R").apply(role)
        for i in range(role.num_replicas)
    ]
    assert [r.args for r in replicas] == [["--rank", "0"], ["--rank", "1"]]
    assert len(calls) == 2 and "args" in role.overrides  # the caller's role is untouched


def test_macro_values_resolve_an_awaitable_override_once() -> None:
    async def entrypoint() -> str:
        return "from-coroutine"

    role = specs.Role(name="r", image="i", overrides={"entrypoint": entrypoint()})
    values = specs.macros.Values(img_root="", app_id="a", replica_id="0", rank0_env="R")
    assert [values.apply(role).entrypoint for _ in range(2)] == ["from-coroutine"] * 2


def test_retry_policies_include_upstream_0_7_hot_spare() -> None:
    assert specs.RetryPolicy("HOT_SPARE") is specs.RetryPolicy.HOT_SPARE
    assert {p.value for p in specs.RetryPolicy} == {"REPLICA", "APPLICATION", "ROLE", "HOT_SPARE"}


def test_resource_copy_and_named_resources() -> None:
    r = specs.Resource.copy(specs.resource(cpu=2, memMB=100), foo="bar")
    assert r.capabilities == {"foo": "bar"} and r.cpu == 2
    assert specs.resource() == specs.Resource(2, 0, 1024)
    assert (
        specs.get_named_resources("aws_p3.2xlarge").capabilities["node.kubernetes.io/instance-type"]
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
    with pytest.raises(specs.InvalidArgumentError, match="unknown mount option 'colour'"):
        specs.parse_mounts(["type=bind,src=/a,dst=/b,colour=red"])
    with pytest.raises(specs.InvalidArgumentError, match="perm='rx' is not valid"):
        specs.parse_mounts(["type=device,src=/dev/x,perm=rx"])
    assert specs.parse_mounts(["type=bind", "source=~/d", "target=/d", "read_only"]) == [
        specs.BindMount(os.path.expanduser("~/d"), "/d", True)
    ]


@pytest.mark.parametrize("value", ["", "=yes", "=YES", "=true", "=1", "=on", "=On"])
def test_parse_mounts_readonly_yes(value: str) -> None:
    assert specs.parse_mounts([f"type=bind,src=/a,dst=/b,readonly{value}"]) == [
        specs.BindMount("/a", "/b", read_only=True)
    ]
    assert specs.parse_mounts([f"type=volume,src=v,dst=/b,read_only{value}"]) == [
        specs.VolumeMount("v", "/b", read_only=True)
    ]


@pytest.mark.parametrize("value", ["no", "false", "0", "off", "OFF"])
def test_parse_mounts_readonly_no(value: str) -> None:
    writable = [specs.BindMount("/a", "/b", read_only=False)]
    assert specs.parse_mounts([f"type=bind,src=/a,dst=/b,readonly={value}"]) == writable
    assert specs.parse_mounts(["type=bind,src=/a,dst=/b"]) == writable


@pytest.mark.parametrize("value", ["", "maybe", "y", "2", "ro", "yes please"])
def test_parse_mounts_readonly_unclear_is_an_error(value: str) -> None:
    # never silently writable: a value that is not a clear yes or no is refused
    with pytest.raises(specs.InvalidArgumentError, match="readonly=.* is not valid") as e:
        specs.parse_mounts([f"type=bind,src=/a,dst=/b,readonly={value}"])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "opt, needle",
    [
        ("type=bind,src=/a,dst=/b,perm=r", "unknown mount option 'perm' for type=bind"),
        ("type=volume,src=v,dst=/b,perm=r", "unknown mount option 'perm' for type=volume"),
        ("type=device,src=/dev/x,readonly", "unknown mount option 'readonly' for type=device"),
        ("type=bind,src=/a,dst=/b,ro", "unknown mount option 'ro' for type=bind"),
        ("type=bind,src=/a,dst=/b,readonly,readonly=no", "readonly is given twice"),
        ("type=bind,src=/a,src=/c,dst=/b", "src is given twice"),
        ("type=bind,src,dst=/b", "missing src="),
    ],
)
def test_parse_mounts_options_a_type_does_not_read_are_errors(opt: str, needle: str) -> None:
    with pytest.raises(specs.InvalidArgumentError, match=needle):
        specs.parse_mounts([opt])


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
