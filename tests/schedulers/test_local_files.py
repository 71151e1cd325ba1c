"""local_cwd files under bad data and hostile input: a bad state or request file makes
only its own app unreadable, job state is private (0600/0700), a relative ``log_dir``
works from anywhere, and hostile names write nothing."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.schedulers.test_local_support import app, app_dir, home, role, torchx
from torchx import specs
from torchx.runner import get_runner
from torchx.schedulers.local_scheduler import UnreadableAppError, create_scheduler
from torchx.specs.names import InvalidNameError

__all__ = ["home"]

pytestmark = pytest.mark.usefixtures("home")

BAD = {
    "bogus-state": ("state.json", '{"state": "BOGUS"}'),
    "empty-state": ("state.json", "{}"),
    "garbage-state": ("state.json", "\x00\x17not json"),
    "empty-request": ("request.json", "{}"),
    "garbage-request": ("request.json", "[1, 2"),
}


def test_bad_files_make_only_their_own_app_unreadable(tmp_path: Path) -> None:
    with get_runner() as runner:
        handles = {}
        for name in [*BAD, "good"]:
            h = runner.run(app(role("true"), name=name), "local_cwd")
            runner.wait(h, wait_interval=0.1)
            handles[name] = h
    for name, (fname, content) in BAD.items():
        (app_dir(handles[name]) / fname).write_text(content)

    out = torchx("list", "-s", "local_cwd", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert handles["good"] in out.stdout
    assert all(handles[name] not in out.stdout for name in BAD)
    warnings = out.stderr.strip().splitlines()
    assert len(warnings) == len(BAD), out.stderr
    for name, (fname, _) in BAD.items():
        path = str(app_dir(handles[name]) / fname)
        assert sum(1 for w in warnings if path in w and "unreadable" in w) == 1, (path, warnings)

    for name, (fname, _) in BAD.items():
        out = torchx("status", handles[name], cwd=tmp_path)
        assert out.returncode == 1 and out.stdout == "", out
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
        assert "unreadable" in out.stderr and str(app_dir(handles[name]) / fname) in out.stderr
    sched = create_scheduler("torchx")
    with pytest.raises(UnreadableAppError, match="unknown state 'BOGUS'"):
        sched.describe(handles["bogus-state"].rsplit("/", 1)[1])
    assert [a.name for a in sched.list()] == ["good"]


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_job_state_is_private_whatever_the_umask(tmp_path: Path) -> None:
    r = role("echo $SECRET_TOKEN; echo err >&2", n=2)
    r.env["SECRET_TOKEN"] = "s3cr3t"
    old = os.umask(0)
    try:
        with get_runner() as runner:
            default = runner.run(app(r), "local_cwd")  # logs inside the app's directory
            own = runner.run(app(r), "local_cwd", cfg={"log_dir": str(tmp_path / "logs")})
            for h in (default, own):
                runner.wait(h, wait_interval=0.1)
                assert "".join(runner.log_lines(h, "w", 1)).count("s3cr3t") == 1
    finally:
        os.umask(old)
    roots = [app_dir(default), app_dir(own), tmp_path / "logs"]
    for root in roots:
        paths = [root, *root.rglob("*")]
        assert len(paths) > 5
        for p in paths:
            assert _mode(p) == (0o700 if p.is_dir() else 0o600), p
    assert "s3cr3t" in (app_dir(own) / "request.json").read_text()  # hence 0600
    assert _mode(app_dir(own).parent) == 0o700  # the session's directory


def test_a_relative_log_dir_is_made_absolute_at_submit(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    os.chdir(tmp_path / "a")
    out = torchx("run", "-s", "local_cwd", "-cfg", "log_dir=rel-logs", "utils.echo", "--msg", "hi")
    assert out.returncode == 0, out.stderr
    handle = out.stdout.split()[0]
    assert (tmp_path / "a" / "rel-logs" / "torchx").is_dir()
    desc = create_scheduler("torchx").describe(handle.rsplit("/", 1)[1])
    assert desc is not None and desc.ui_url.startswith(f"file://{tmp_path}/a/rel-logs/")
    out = torchx("log", handle, cwd=tmp_path)  # from another directory
    assert out.returncode == 0 and out.stdout == "echo/0 hi\n", out


@pytest.mark.parametrize(
    "bad",
    [
        specs.AppDef("t", [specs.Role("../../../../victim", ".", entrypoint="true")]),
        specs.AppDef("t", [specs.Role("w" * 300, ".", entrypoint="true")]),
        specs.AppDef("t" * 300, [specs.Role("w", ".", entrypoint="true")]),
    ],
)
def test_hostile_names_are_refused_with_nothing_written(
    bad: specs.AppDef, home: Path, tmp_path: Path
) -> None:
    before = sorted(tmp_path.rglob("*"))
    with get_runner() as runner, pytest.raises(InvalidNameError, match="name"):
        runner.run(bad, "local_cwd")
    with pytest.raises(InvalidNameError):
        create_scheduler("torchx").submit(bad, {})
    assert not (home / "local_cwd" / "torchx").exists() or not any(
        (home / "local_cwd" / "torchx").iterdir()
    )
    assert [p for p in sorted(tmp_path.rglob("*")) if p not in before and "victim" in str(p)] == []
