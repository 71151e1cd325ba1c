"""``torchx run --workspace``: flag parsing, the default, and what reaches the Runner.

The end-to-end tests at the bottom run once the scheduler mixes in its workspace (they
skip until then): a file that exists only in the workspace must reach the job.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest

from torchx.cli.cmd_run import CmdRun, resolve_workspace
from torchx.cli.main import create_parser, run_main
from torchx.runner.api import Runner
from torchx.schedulers.local_scheduler import LocalScheduler
from torchx.workspace import WorkspaceMixin, apply_workspace
from torchx.workspace.dir_workspace import LocalDirWorkspaceMixin

TORCHX = os.path.join(os.path.dirname(sys.executable), "torchx")


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("TORCHXCONFIG", "TORCHX_TRACKERS", "TORCHX_PARENT_RUN_ID", "LOGLEVEL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture()
def seen(monkeypatch: pytest.MonkeyPatch) -> List[Any]:
    """Records the workspace the CLI hands to the real ``Runner.dryrun_component``."""
    calls: List[Any] = []
    real = Runner.dryrun_component

    def spy(self: Runner, *args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("workspace", "<not passed>"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Runner, "dryrun_component", spy)
    return calls


def test_flag_and_alias_parse() -> None:
    for flag in ("--workspace", "--buck-target"):
        argv = ["run", flag, "/src/proj", "utils.echo"]
        args, _ = create_parser(argv)[0].parse_known_args(argv)
        assert args.workspace == "/src/proj"
    argv = ["run", "utils.echo", "--msg", "x"]
    args, _ = create_parser(argv)[0].parse_known_args(argv)
    assert args.workspace is None  # resolved at run time (config, then the cwd)


def test_resolve_workspace(tmp_path: Path) -> None:
    assert resolve_workspace(None, {}) == f"file://{tmp_path}"
    assert resolve_workspace("", {}) is None
    assert resolve_workspace("/w", {"workspace": "/cfg"}) == "/w"
    assert resolve_workspace(None, {"workspace": "/cfg"}) == "/cfg"
    assert resolve_workspace(None, {"workspace": ""}) is None


def _dryrun(*flags: str) -> int:
    return run_main(["run", "--dryrun", "-s", "local_cwd", *flags, "utils.echo", "--msg", "hi"])


def test_default_is_the_current_directory(seen: List[Any], tmp_path: Path) -> None:
    assert _dryrun() == 0 and seen == [f"file://{tmp_path}"]


def test_explicit_and_disabled(seen: List[Any], tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    assert _dryrun("--workspace", str(tmp_path / "proj")) == 0
    assert _dryrun("--workspace", "") == 0
    assert seen == [str(tmp_path / "proj"), None]


def test_torchxconfig_cli_run_workspace(seen: List[Any], tmp_path: Path) -> None:
    conf, flag = tmp_path / "from_config", tmp_path / "from_flag"
    conf.mkdir()
    flag.mkdir()
    (tmp_path / ".torchxconfig").write_text(f"[cli:run]\nworkspace = {conf}\n")
    assert _dryrun() == 0
    assert _dryrun("--workspace", str(flag)) == 0
    (tmp_path / ".torchxconfig").write_text("[cli:run]\nworkspace =\n")
    assert _dryrun() == 0
    assert seen == [str(conf), str(flag), None]


def test_stdin_workspace(
    seen: List[Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    req = {"component_name": "utils.echo", "scheduler": "local_cwd", "dryrun": True}
    for workspace in ("", str(tmp_path)):
        monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({**req, "workspace": workspace})))
        assert run_main(["run", "--stdin"]) == 0
    assert seen == [None, str(tmp_path)]
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(req)))
    assert run_main(["run", "--stdin", "--workspace", str(tmp_path)]) == 2
    assert "give no other flags" in capsys.readouterr().err


def test_dryrun_prints_the_workspace_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchx.components.utils import sh

    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "job.sh").write_text("echo hi\n")
    app = sh("sh", "job.sh")
    from tests.workspace.test_dir_workspace import with_mixin

    sched = with_mixin(LocalDirWorkspaceMixin, LocalScheduler)("torchx")
    build = apply_workspace(sched, app, str(ws), {})
    info = sched.submit_dryrun(app, {})
    info._workspace = build  # type: ignore[attr-defined]  # what the Runner attaches
    CmdRun()._print_dryrun(info)
    out = capsys.readouterr().out
    section = out.split("=== WORKSPACE ===\n", 1)[1]
    assert section.startswith(f"workspace {ws} -> role sh: torchx:")
    assert section.rstrip().endswith("1 file(s):\n  job.sh")


def test_missing_script_is_looked_up_in_the_workspace(tmp_path: Path) -> None:
    from torchx.cli.cmd_base import CommandError
    from torchx.cli.cmd_run import check_script_exists

    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "train.py").write_text("")
    check_script_exists("utils.python", ["--script", "train.py"], str(ws))
    check_script_exists("utils.python", ["--script", "train.py"], f"file://{ws}")
    with pytest.raises(CommandError, match=f"no such file in {tmp_path}"):
        check_script_exists("utils.python", ["--script", "train.py"], None)


# --------------------------------------------------------------------------- end to end


def _tx(args: List[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, **env)
    return subprocess.run(
        [TORCHX, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=120
    )


@pytest.mark.skipif(
    not issubclass(LocalScheduler, WorkspaceMixin),
    reason="local_cwd does not mix in LocalDirWorkspaceMixin yet",
)
def test_local_cwd_runs_in_a_copy_of_the_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "only_here.txt").write_text("from the workspace\n")
    (ws / "secret.txt").write_text("must not be copied\n")
    (ws / ".torchxignore").write_text("secret.txt\n")
    (ws / "job.sh").write_text(
        "cat only_here.txt\ntest -e secret.txt && echo LEAKED || echo no-secret\npwd\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    p = _tx(
        ["run", "-s", "local_cwd", "--workspace", str(ws), "utils.sh", "sh", "job.sh"], elsewhere
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[1:3] == ["sh/0 from the workspace", "sh/0 no-secret"]
    assert lines[3].startswith(f"sh/0 {tmp_path / 'home' / 'workspaces'}/sh-")
    # the default workspace (the cwd) runs in place
    p = _tx(["run", "-s", "local_cwd", "utils.sh", "pwd"], ws)
    assert p.returncode == 0 and p.stdout.splitlines()[1] == f"sh/0 {ws}"


def test_kubernetes_dryrun_shows_the_pushed_image_and_run_needs_docker(tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "train.py").write_text("print(1)\n")
    (ws / "big.bin").write_text("x")
    (ws / ".dockerignore").write_text("*.bin\n")
    cfg = "queue=default,image_repo=example.com/team/app"
    base = ["run", "-s", "kubernetes", "-cfg", cfg, "--workspace", str(ws)]
    p = _tx([*base, "--dryrun", "utils.echo"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert re.search(r"image: example\.com/team/app:[0-9a-f]{64}\b", p.stdout), p.stdout
    section = p.stdout.split("=== WORKSPACE ===\n", 1)[1]
    assert section.rstrip().endswith("3 file(s):\n  Dockerfile.torchx\n  .dockerignore\n  train.py")
    p = _tx([*base, "utils.echo"], tmp_path, DOCKER_HOST="unix:///nonexistent/docker.sock")
    assert p.returncode == 1
    (line,) = p.stderr.strip().splitlines()
    assert (
        line.startswith("torchx: error: cannot reach a Docker engine") and '--workspace ""' in line
    )
