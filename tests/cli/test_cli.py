"""The torchx command, run as a real process (the installed console script)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import psutil
import pytest

from tests.processes import wait_for_job_processes

TORCHX = os.path.join(os.path.dirname(sys.executable), "torchx")


def tx(
    args: List[str], env: dict, cwd: Path, timeout: float = 120, input: str | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TORCHX, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
    )


def test_run_echo_prints_every_time(env: dict, tmp_path: Path) -> None:
    for _ in range(15):
        p = tx(["run", "-s", "local_cwd", "utils.echo", "--msg", "hi"], env, tmp_path)
        assert p.returncode == 0, p.stderr
        lines = p.stdout.splitlines()
        assert lines[0].startswith("local_cwd://torchx/echo-") and lines[1:] == ["echo/0 hi"]


def test_failing_job_exit_code_and_error_line(env: dict, tmp_path: Path) -> None:
    p = tx(["run", "utils.python", "--c", "raise KeyError('no such column')"], env, tmp_path)
    assert p.returncode == 1
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "FAILED" in err[0] and "KeyError" in err[0]
    assert "python/0 KeyError: 'no such column'" in p.stdout


def test_dryrun_shows_app_and_request(env: dict, tmp_path: Path) -> None:
    p = tx(
        ["run", "--dryrun", "-s", "local_cwd", "dist.ddp", "-j", "1x2", "--script", "train.py"],
        env,
        tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert "=== APPLICATION ===" in p.stdout and "=== SCHEDULER REQUEST ===" in p.stdout
    assert "--nproc_per_node 2" in p.stdout and "--max_restarts 0" in p.stdout
    assert not (tmp_path / "home" / "local_cwd").exists() or not any(
        (tmp_path / "home" / "local_cwd").rglob("request.json")
    )


def test_component_help(env: dict, tmp_path: Path) -> None:
    comp = Path(__file__).resolve().parents[2] / "examples" / "components.py"
    p = tx(["run", "-s", "local_cwd", f"{comp}:trainer", "--help"], env, tmp_path)
    assert (
        p.returncode == 0
        and "--max_restarts" in p.stdout
        and "(required)" in p.stdout
        and "elastic DDP" in p.stdout
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "utils.ech"], "did you mean utils.echo"),
        (["run", "-s", "nope", "utils.echo"], "available schedulers: "),
        (["status", "not-a-handle"], "not a valid app handle"),
        (["status", "local_cwd://torchx/nope-123"], "does not exist"),
        (["log", "local_cwd://torchx/nope-123"], "does not exist"),
        (["cancel", "local_cwd://torchx/nope-123"], "does not exist"),
        (["describe", "local_cwd://torchx/nope-123"], "does not exist"),
        (["run", "-cfg", "nope=1", "utils.echo"], "Unknown run option 'nope'"),
        (["run", "-cfg", "prepend_cwd=maybe", "utils.echo"], "must be of type bool"),
        (["run", "-cfg", "log_dir", "utils.echo"], "expected KEY=VALUE"),
        (["run", "utils.echo", "--bogus", "1"], "unrecognized arguments: --bogus"),
        (["run", "utils.echo", "--num_replicas", "two"], "expected int"),
        (["run", "dist.ddp", "-j", "0x2", "--script", "t.py"], "invalid -j '0x2'"),
        (["run", "dist.ddp", "-j", "3:2x1", "--script", "t.py"], "MIN nodes (3) > MAX nodes (2)"),
        (["run", "dist.ddp", "-j", "1x2"], "exactly one of --script"),
        (["run", "utils.binary", "--entrypoint", "no-such-bin"], "not found on PATH"),
        (["run", "missing.py:fn"], "does not exist"),
        (["runopts", "nope"], "unknown scheduler 'nope'"),
        (["run"], "no component given"),
    ],
)
def test_bad_input_is_one_line(env: dict, tmp_path: Path, args: List[str], needle: str) -> None:
    p = tx(args, env, tmp_path)
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], p.stderr


def test_bad_component_file_annotation(env: dict, tmp_path: Path) -> None:
    (tmp_path / "comp.py").write_text(
        "import torchx.specs as specs\n"
        "def trainer(lr, epochs: int = 1) -> specs.AppDef:\n    return specs.AppDef('x')\n"
        "def other(x: set) -> specs.AppDef:\n    return specs.AppDef('x')\n"
    )
    p = tx(["run", "comp.py:trainer"], env, tmp_path)
    assert p.returncode == 1 and p.stderr.strip().count("\n") == 0
    # upstream's linter message, in one line
    assert "Component comp.py:trainer has validation errors: Arg lr missing type annotation" in (
        p.stderr
    )
    # upstream's linter accepts `set`; it fails, in one line, when given on the command line
    p = tx(["run", "comp.py:other", "--x", "a"], env, tmp_path)
    assert p.returncode != 0 and p.stderr.strip().count("\n") == 0
    assert "argument --x" in p.stderr and "Traceback" not in p.stderr


def test_bad_torchxconfig(env: dict, tmp_path: Path) -> None:
    (tmp_path / ".torchxconfig").write_text("[local_cwd\nlog_dir=/tmp\n")
    p = tx(["run", "utils.echo"], env, tmp_path)
    assert p.returncode == 1 and "malformed" in p.stderr and "Traceback" not in p.stderr
    p = tx(["run", "utils.echo"], dict(env, TORCHXCONFIG=str(tmp_path / "missing")), tmp_path)
    assert p.returncode == 1 and "not a file" in p.stderr


def test_torchxconfig_defaults(env: dict, tmp_path: Path) -> None:
    logs = tmp_path / "mylogs"
    (tmp_path / ".torchxconfig").write_text(
        "[cli:run]\ncomponent = utils.echo\n[component:utils.echo]\nmsg = from-config\n"
        f"[local_cwd]\nlog_dir = {logs}\n"
    )
    p = tx(["run"], env, tmp_path)
    assert p.returncode == 0 and "echo/0 from-config" in p.stdout
    assert list(logs.rglob("combined.log"))


def test_second_process_sees_running_and_finished_apps(env: dict, tmp_path: Path) -> None:
    runner = subprocess.Popen(
        [
            TORCHX,
            "run",
            "-s",
            "local_cwd",
            "utils.sh",
            "sh",
            "-c",
            "echo begin; sleep 30; echo end",
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert runner.stdout is not None
    handle = runner.stdout.readline().strip()
    deadline = time.monotonic() + 30
    while "begin" not in tx(["log", handle], env, tmp_path).stdout and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "State: RUNNING" in tx(["status", handle], env, tmp_path).stdout
    assert handle in tx(["list", "-s", "local_cwd"], env, tmp_path).stdout
    assert tx(["log", f"{handle}/sh/0"], env, tmp_path).stdout == "sh/0 begin\n"
    assert "sh" in tx(["describe", handle], env, tmp_path).stdout
    cancel = tx(["cancel", handle], env, tmp_path)
    assert cancel.returncode == 0 and "CANCELLED" in cancel.stdout
    assert runner.wait(timeout=60) == 1  # the launching `torchx run` reports the cancellation
    status = tx(["status", "--json", handle], env, tmp_path)
    assert '"state": "CANCELLED"' in status.stdout
    # the whole log is readable once cancelled, and the app ran nothing after the cancel
    # (sh and its sleep are signalled at once: tests/schedulers/test_local_cancel.py)
    assert tx(["log", "-t", handle], env, tmp_path).stdout == "sh/0 begin\n"


# A shell starts a command with Ctrl-C (SIGINT) not ignored. This test process may have it
# ignored for a moment (a C ``system()`` in some library thread ignores SIGINT and SIGQUIT
# process-wide; measured once: the CLI started with both ignored), and an ignored signal
# is inherited: start the CLI as a shell would.
AS_FROM_A_TERMINAL = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL);"
    " os.execv(sys.argv[1], sys.argv[1:])"
)


def _why_no_exit(proc: subprocess.Popen) -> str:
    """What kept a CLI from ending: its signal masks and threads' stacks, or, if it did
    exit, the processes that still hold its output pipe."""
    if proc.poll() is not None:
        assert proc.stderr is not None
        pipe = os.readlink(f"/proc/self/fd/{proc.stderr.fileno()}")
        holders = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                fds = os.listdir(f"/proc/{p.pid}/fd")
                if pipe in [os.readlink(f"/proc/{p.pid}/fd/{fd}") for fd in fds]:
                    holders.append(p.info)
            except OSError:
                pass
        return f"exited {proc.returncode}, but its output pipe is held by {holders}"
    with open(f"/proc/{proc.pid}/status") as f:
        masks = [line.strip() for line in f if line.startswith(("SigIgn", "SigCgt"))]
    proc.send_signal(signal.SIGABRT)
    _, err = proc.communicate(timeout=30)
    return f"no exit 60 s after Ctrl-C ({masks}); its threads:\n{err}"


def test_ctrl_c_cancels_the_app(env: dict, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", AS_FROM_A_TERMINAL, TORCHX, "run", "utils.sh"]
        + ["--num_replicas", "2", "sleep", "600"],
        env=dict(env, PYTHONFAULTHANDLER="1"),  # a SIGABRT prints every thread's stack
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    handle = proc.stdout.readline().strip()
    sleeps = wait_for_job_processes(handle, 2, ["sleep", "600"], timeout=30)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(_why_no_exit(proc)) from None
    assert proc.returncode == 130 and "Traceback" not in err
    gone, alive = psutil.wait_procs(sleeps, timeout=30)
    assert not alive
    assert "CANCELLED" in tx(["status", handle], env, tmp_path).stdout


def test_builtins_runopts_configure_version(env: dict, tmp_path: Path) -> None:
    b = tx(["builtins"], env, tmp_path).stdout
    for name in (
        "dist.ddp",
        "dist.spmd",
        "utils.echo",
        "utils.sh",
        "utils.python",
        "utils.copy",
        "utils.binary",
        "utils.touch",
    ):
        assert name in b
    assert "def echo(" in tx(["builtins", "--print", "utils.echo"], env, tmp_path).stdout
    assert "prepend_cwd" in tx(["runopts", "local_cwd"], env, tmp_path).stdout
    assert tx(["configure", "-a"], env, tmp_path).returncode == 0
    assert "[local_cwd]" in (tmp_path / ".torchxconfig").read_text()
    assert tx(["--version"], env, tmp_path).stdout.startswith("torchx ")
    assert "run" in tx(["--help"], env, tmp_path).stdout


def test_stdin_json(env: dict, tmp_path: Path) -> None:
    p = tx(
        ["run", "--stdin"],
        env,
        tmp_path,
        input='{"component_name": "utils.echo", "component_args": {"msg": "json"}}',
    )
    assert p.returncode == 0 and "echo/0 json" in p.stdout


def test_ddp_script_with_a_space_in_its_path_runs(env: dict, tmp_path: Path) -> None:
    """Upstream runs it; the role name is derived from the file name (``my_script``)."""
    (tmp_path / "my dir").mkdir()
    (tmp_path / "my dir" / "my script.py").write_text(
        "import os, sys\nprint('rank', os.environ['RANK'], 'ran', sys.argv[1:])\n"
    )
    p = tx(
        ["run", "-s", "local_cwd", "dist.ddp", "-j", "1x1", "--script", "my dir/my script.py"]
        + ["--", "an arg"],
        env,
        tmp_path,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert "rank 0 ran ['an arg']" in p.stdout, p.stdout
    assert "my_script/0" in p.stdout


def test_a_role_name_the_user_gives_is_still_checked(env: dict, tmp_path: Path) -> None:
    (tmp_path / "comp.py").write_text(
        "import torchx.specs as specs\n"
        "def c() -> specs.AppDef:\n"
        "    role = specs.Role('my role', image='.', entrypoint='echo')\n"
        "    return specs.AppDef('a', roles=[role])\n"
    )
    p = tx(["run", "--dryrun", "-s", "local_cwd", "comp.py:c"], env, tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode != 0
    assert len(lines) == 1 and "role name 'my role' is not allowed" in lines[0], p.stderr


def test_slurm_account_and_qos_in_runopts_and_dryrun(env: dict, tmp_path: Path) -> None:
    opts = tx(["runopts", "slurm"], env, tmp_path).stdout
    assert "account=ACCOUNT (str, None)" in opts and "qos=QOS (str, None)" in opts
    cfg = "account=research,qos=high"
    p = tx(
        ["run", "--dryrun", "-s", "slurm", "-cfg", cfg, "utils.sh", "--num_replicas", "2", "true"],
        env,
        tmp_path,
    )
    assert p.returncode == 0, p.stderr
    groups = [line for line in p.stdout.splitlines() if line.startswith("#SBATCH --job-name")]
    assert len(groups) == 2 and all("--account=research --qos=high" in g for g in groups), p.stdout
