"""Named resources: upstream's generic and AWS sizes, and the plugin loader behind them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchx import specs
from torchx.specs import named_resources_aws as aws

GIB = 983  # upstream: int(1024 * MEM_TAX)


def test_aws_instances_as_upstream_defines_them() -> None:
    p4d = specs.named_resources["aws_p4d.24xlarge"]
    assert (p4d.cpu, p4d.gpu, p4d.memMB) == (96, 8, 1152 * GIB)
    assert p4d.capabilities == {aws.K8S_ITYPE: "p4d.24xlarge"}
    assert p4d.devices == {aws.EFA_DEVICE: 4}
    trn = aws.aws_trn1_32xlarge()
    assert trn.devices == {aws.EFA_DEVICE: 8, aws.NEURON_DEVICE: 16} and trn.gpu == 0
    assert aws.aws_t3_medium().memMB == 4 * GIB and aws.GiB == GIB
    assert specs.AWS_NAMED_RESOURCES["aws_g5.48xlarge"]().devices == {aws.EFA_DEVICE: 1}


def test_every_aws_function_is_registered_under_its_instance_name() -> None:
    functions = {n for n in dir(aws) if n.startswith("aws_") and callable(getattr(aws, n))}
    assert len(functions) >= 40
    for name in functions:
        resource = getattr(aws, name)()
        key = "aws_" + resource.capabilities[aws.K8S_ITYPE]
        assert aws.NAMED_RESOURCES[key] is getattr(aws, name), key
        assert key in specs.named_resources
    assert len(aws.NAMED_RESOURCES) == len(functions)


def test_each_call_gives_a_fresh_resource() -> None:
    a = specs.named_resources["aws_p3.2xlarge"]
    a.capabilities["x"] = "y"
    assert "x" not in specs.named_resources["aws_p3.2xlarge"].capabilities


def test_instance_type_from_resource() -> None:
    assert aws.instance_type_from_resource(aws.aws_p5_48xlarge()) == "p5.48xlarge"
    with pytest.warns(UserWarning, match="instance type"):
        assert aws.instance_type_from_resource(specs.Resource(1, 0, 1)) is None


def test_generic_resources_and_gib() -> None:
    assert specs.GiB == 1024
    assert specs.GENERIC_NAMED_RESOURCES["gpu.small"]() == specs.Resource(8, 1, 32 * 1024)
    assert specs.named_resources["cpu.nano"].memMB == 512
    with pytest.raises(KeyError, match="did you mean 'aws_p3.2xlarge'"):
        specs.named_resources["aws_p3.2xlarg"]


def test_load_group_calls_the_entry_point_with_the_given_args(tmp_path: Path) -> None:
    (tmp_path / "mymod.py").write_text("def make(name, size=1):\n    return f'{name}:{size}'\n")
    dist_info = tmp_path / "mymod-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: mymod\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text("[my.group]\nfn = mymod:make\nmod = mymod\n")
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        from torchx.specs import load_group
        group = load_group("my.group")
        print(group["fn"]("a", size=2), group["mod"]("ignored").__name__)
        print(load_group("no.such.group"), load_group("no.such.group", default={{"x": 1}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split("\n")[:2] == ["a:2 mymod", "None {'x': 1}"], out.stderr
