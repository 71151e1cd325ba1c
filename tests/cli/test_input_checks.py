"""Loose input where safety depends on it, through the real ``torchx`` CLI: each is refused
in one line, with a non-zero exit, before anything is submitted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

TORCHX = os.path.join(os.path.dirname(sys.executable), "torchx")


def tx(args: List[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TORCHX, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def _refused(p: subprocess.CompletedProcess, needle: str, env: dict, cwd: Path) -> None:
    """One line on stderr naming the problem, exit 1, nothing on stdout, no app submitted."""
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert p.stderr.startswith("torchx: error: ") and p.stderr.count("\n") == 1, p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert p.stdout == "", p.stdout  # no handle: nothing was submitted
    listed = tx(["list", "-s", "local_cwd"], env, cwd)
    assert listed.returncode == 0 and "local_cwd://" not in listed.stdout, listed.stdout


@pytest.mark.parametrize("value", ["yes", "on", "maybe"])
def test_readonly_mount_value(env: dict, tmp_path: Path, value: str) -> None:
    mount = f"type=bind,src={tmp_path},dst=/data,readonly={value}"
    if value == "maybe":  # neither yes nor no: refused, never taken as writable
        p = tx(["run", "-s", "local_cwd", "utils.sh", "--mounts", mount, "true"], env, tmp_path)
        _refused(p, "mount option readonly='maybe' is not valid", env, tmp_path)
    else:  # read-only, as docker reads it
        args = ["run", "-s", "local_cwd", "--dryrun", "utils.sh", "--mounts", mount, "true"]
        p = tx(args, env, tmp_path)
        assert p.returncode == 0, p.stderr
        assert "'dst_path': '/data', 'read_only': True" in " ".join(p.stdout.split())


def test_unknown_mount_option(env: dict, tmp_path: Path) -> None:
    mount = f"type=bind,src={tmp_path},dst=/data,perm=r"
    p = tx(["run", "-s", "local_cwd", "utils.sh", "--mounts", mount, "true"], env, tmp_path)
    _refused(p, "unknown mount option 'perm' for type=bind", env, tmp_path)


@pytest.mark.parametrize(
    "component",
    [["utils.sh", "--env", "BAD NAME=1", "true"], ["dist.ddp", "--env", "BAD NAME=1"]],
)
def test_bad_env_name(env: dict, tmp_path: Path, component: List[str]) -> None:
    (tmp_path / "t.py").write_text("print('ran')\n")
    if component[0] == "dist.ddp":
        component = [*component, "-j", "1x1", "--script", "t.py"]
    p = tx(["run", "-s", "local_cwd", *component], env, tmp_path)
    _refused(p, "env var name 'BAD NAME' of role", env, tmp_path)
    assert "letters, digits and '_'" in p.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            ["run", "-s", "local_cwd", "dist.ddp", "-j", "1x99999999999999999999"],
            "invalid -j '1x99999999999999999999': at most 1,024 processes per node",
        ),
        (
            ["run", "-s", "local_cwd", "dist.ddp", "-j", "1:99999999999999999999x1"],
            "at most 10,000 nodes",
        ),
        (
            ["torchrun", "--nproc_per_node", "99999999999999999999"],
            "torchrun --nproc_per_node 99999999999999999999: at most 1,024 processes per node",
        ),
    ],
)
def test_huge_j(env: dict, tmp_path: Path, args: List[str], needle: str) -> None:
    (tmp_path / "t.py").write_text("print('ran')\n")
    script = ["t.py"] if args[0] == "torchrun" else ["--script", "t.py"]
    p = tx([*args, *script], env, tmp_path)
    _refused(p, needle, env, tmp_path)


def test_torchxconfig_unknown_key_and_parse_error(env: dict, tmp_path: Path) -> None:
    config = tmp_path / ".torchxconfig"
    config.write_text("[component:utils.echo]\nmsg = hi\n[local_cwd]\nlog_dri = /tmp/x\n")
    p = tx(["run", "-s", "local_cwd", "utils.echo"], env, tmp_path)
    _refused(p, f"{config}, line 4: Unknown run option 'log_dri'", env, tmp_path)
    assert "(did you mean 'log_dir'?)" in p.stderr
    config.write_text("[local_cwd]\nlog_dir = /tmp/x\nnot a key value line\n")
    p = tx(["run", "-s", "local_cwd", "utils.echo"], env, tmp_path)
    _refused(p, f"malformed {config}, line 3: cannot parse 'not a key value line'", env, tmp_path)
