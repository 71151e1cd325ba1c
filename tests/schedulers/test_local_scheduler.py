"""local_cwd with real processes: on-disk state seen from other processes, no lost output,
cancel of whole process trees, retries, and the launcher dying mid-job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import List

import psutil
import pytest

from torchx import specs
from torchx.runner import get_runner
from torchx.schedulers.api import InvalidAppError, Stream
from torchx.schedulers.local_scheduler import create_scheduler


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _role(script: str, name: str = "w", n: int = 1, **kw: object) -> specs.Role:
    return specs.Role(
        name=name, image=".", entrypoint="sh", args=["-c", script], num_replicas=n, **kw
    )  # type: ignore[arg-type]


def _app(*roles: specs.Role) -> specs.AppDef:
    return specs.AppDef(name="t", roles=list(roles))


def _wait(runner, handle: str) -> specs.AppStatus:  # type: ignore[no-untyped-def]
    status = runner.wait(handle, wait_interval=0.2, timeout=120)
    assert status is not None and status.is_terminal(), status
    return status


def _other_process(code: str, tmp_path: Path) -> str:
    """Run python code in a fresh interpreter (same TORCHX_HOME) and return its stdout."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _alive(pids: List[int]) -> List[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _replica_pids(handle: str) -> List[int]:
    app_id = handle.rsplit("/", 1)[1]
    state = json.loads(
        (
            Path(os.environ["TORCHX_HOME"]) / "local_cwd" / "torchx" / app_id / "state.json"
        ).read_text()
    )
    return [r["pid"] for r in state["replicas"] if r["pid"]]


def test_statuses_per_role_and_replica() -> None:
    with get_runner() as runner:
        h = runner.run(
            _app(_role("exit 0", "ok", 2), _role('[ "$0" ] && exit 0', "other")), "local_cwd"
        )
        status = _wait(runner, h)
    assert status.state == specs.AppState.SUCCEEDED
    assert [(r.role, [x.state for x in r.replicas]) for r in status.roles] == [
        ("ok", [specs.AppState.SUCCEEDED] * 2),
        ("other", [specs.AppState.SUCCEEDED]),
    ]


def test_macros_and_env() -> None:
    with get_runner() as runner:
        h = runner.run(
            _app(
                specs.Role(
                    name="w",
                    image=".",
                    entrypoint="sh",
                    num_replicas=2,
                    args=[
                        "-c",
                        'echo "$0 $TORCHX_RANK0_HOST $TORCHELASTIC_ERROR_FILE"',
                        "${replica_id}",
                    ],
                )
            ),
            "local_cwd",
        )
        _wait(runner, h)
        line = "".join(runner.log_lines(h, "w", 1))
    assert line.startswith("1 localhost ") and line.rstrip().endswith("/w/1/error.json")


def test_no_lost_output_over_many_runs() -> None:
    sched = create_scheduler("torchx")
    with get_runner() as runner:
        for i in range(30):
            h = runner.run(_app(_role(f"echo line-{i}")), "local_cwd")
            lines = list(runner.log_lines(h, "w", should_tail=True))
            assert lines == [f"line-{i}\n"], (i, lines)
    assert sched.list()


def test_last_line_without_newline_and_large_output() -> None:
    script = (
        "python3 -c \"import sys; [print('x'*100, i) for i in range(20000)];"
        " sys.stdout.write('end')\""
    )
    with get_runner() as runner:
        h = runner.run(_app(_role(script)), "local_cwd")
        lines = list(runner.log_lines(h, "w", should_tail=True, streams=Stream.STDOUT))
    assert len(lines) == 20001 and lines[-1] == "end" and lines[123] == "x" * 100 + " 123\n"


def test_state_is_visible_from_another_process_while_running_and_after(tmp_path: Path) -> None:
    with get_runner() as runner:
        h = runner.run(_app(_role("echo started; sleep 30", n=2)), "local_cwd")
        code = f"""
            from torchx.runner import get_runner
            r = get_runner()
            print(r.status({h!r}).state)
            print([a.app_handle for a in r.list("local_cwd")])
            print(next(iter(r.log_lines({h!r}, "w", 0, should_tail=False)), "").strip())
        """
        deadline = time.monotonic() + 30
        while True:
            out = _other_process(code, tmp_path).splitlines()
            if out[2] == "started" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert out[0] == "RUNNING" and h in out[1] and out[2] == "started"
        _other_process(
            f"from torchx.runner import get_runner; get_runner().cancel({h!r})", tmp_path
        )
        assert _wait(runner, h).state == specs.AppState.CANCELLED
    assert _other_process(code, tmp_path).splitlines()[0] == "CANCELLED"


def test_launcher_killed_mid_job_keeps_job_inspectable_and_cancellable(tmp_path: Path) -> None:
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
            import time
            from torchx import specs
            from torchx.runner import get_runner
            r = get_runner()
            role = specs.Role(
                "w", ".", entrypoint="sh", args=["-c", "sleep 300"], num_replicas=2
            )
            h = r.run(specs.AppDef("t", [role]), "local_cwd")
            print(h, flush=True)
            time.sleep(300)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
        cwd=tmp_path,
    )
    assert launcher.stdout is not None
    handle = launcher.stdout.readline().strip()
    launcher.kill()
    launcher.wait(timeout=30)
    with get_runner() as runner:
        assert runner.status(handle).state == specs.AppState.RUNNING  # type: ignore[union-attr]
        pids = _replica_pids(handle)
        assert len(_alive(pids)) == 2
        runner.cancel(handle)
        assert _wait(runner, handle).state == specs.AppState.CANCELLED
    assert _alive(pids) == []


@pytest.mark.parametrize(
    "policy,expected_runs_of_ok_replica",
    [(specs.RetryPolicy.REPLICA, 1), (specs.RetryPolicy.APPLICATION, 2)],
)
def test_retry_policies(
    tmp_path: Path, policy: specs.RetryPolicy, expected_runs_of_ok_replica: int
) -> None:
    # replica 1 fails on its first attempt only, once replica 0 counted its start (a restart
    # may kill a replica before its first command ran, on a loaded machine)
    script = (
        f"echo run >> {tmp_path}/runs-$0; "
        f'if [ "$0" = 1 ] && [ ! -e {tmp_path}/failed ]; then'
        f" while [ ! -e {tmp_path}/runs-0 ]; do sleep 0.05; done;"
        f" touch {tmp_path}/failed; exit 1; fi; sleep 0.5"
    )
    role = specs.Role(
        name="w",
        image=".",
        entrypoint="sh",
        args=["-c", script, "${replica_id}"],
        num_replicas=2,
        max_retries=1,
        retry_policy=policy,
    )
    with get_runner() as runner:
        h = runner.run(_app(role), "local_cwd")
        status = _wait(runner, h)
    assert status.state == specs.AppState.SUCCEEDED and status.num_restarts == 1
    assert len((tmp_path / "runs-0").read_text().split()) == expected_runs_of_ok_replica


def test_retries_exhausted_fail_with_error_file(tmp_path: Path) -> None:
    err = {
        "message": {
            "message": "ValueError: bad lr",
            "extraInfo": {"py_callstack": "...", "timestamp": "1"},
        }
    }
    script = f"echo '{json.dumps(err)}' > $TORCHELASTIC_ERROR_FILE; exit 1"
    with get_runner() as runner:
        h = runner.run(_app(_role(script, max_retries=1)), "local_cwd")
        status = _wait(runner, h)
    assert status.state == specs.AppState.FAILED and status.num_restarts == 1
    assert "ValueError: bad lr" in status.error_summary()
    assert "ValueError: bad lr" in status.format()


def test_elastic_role_survives_losing_a_replica_down_to_min() -> None:
    role = _role('[ "$0" = 1 ] && exit 1; sleep 0.5', n=2, min_replicas=1)
    role.args.append("${replica_id}")
    with get_runner() as runner:
        status = _wait(runner, runner.run(_app(role), "local_cwd"))
    assert status.state == specs.AppState.SUCCEEDED
    assert [r.state for r in status.roles[0].replicas] == [
        specs.AppState.SUCCEEDED,
        specs.AppState.FAILED,
    ]


def test_gang_role_failure_stops_the_other_replicas() -> None:
    role = _role('[ "$0" = 1 ] && exit 3; sleep 600', n=2)
    role.args.append("${replica_id}")
    with get_runner() as runner:
        status = _wait(runner, runner.run(_app(role), "local_cwd"))
    assert status.state == specs.AppState.FAILED and "exited with code 3" in status.msg


def test_missing_entrypoint_is_an_error_at_submit() -> None:
    with get_runner() as runner, pytest.raises(InvalidAppError, match="no-such-binary"):
        runner.run(_app(specs.Role(name="w", image=".", entrypoint="no-such-binary")), "local_cwd")


def test_a_command_that_cannot_start_says_why_in_the_status(tmp_path: Path) -> None:
    """Not executable: the app FAILED, and its message (not only its log) gives the reason."""
    script = tmp_path / "prog.sh"
    script.write_text("echo hi\n")
    script.chmod(0o644)
    with get_runner() as runner:
        role = specs.Role(name="w", image=str(tmp_path), entrypoint=str(script))
        status = _wait(runner, runner.run(_app(role), "local_cwd"))
    assert status.state == specs.AppState.FAILED
    assert "replica w/0 failed to start" in status.msg and "Permission denied" in status.msg


def test_venv_bin_is_first_on_path() -> None:
    with get_runner() as runner:
        h = runner.run(_app(_role("command -v python")), "local_cwd")
        _wait(runner, h)
        out = "".join(runner.log_lines(h, "w")).strip()
    assert out == os.path.join(os.path.dirname(sys.executable), "python")


def test_concurrent_launchers(tmp_path: Path) -> None:
    code = """
        from torchx.runner import get_runner
        r = get_runner()
        hs = [r.run_component("utils.echo", ["--msg", "c"], "local_cwd") for _ in range(3)]
        print(*[r.wait(h).state for h in hs])
    """
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
            cwd=tmp_path,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(o == ["SUCCEEDED"] * 3 for o in outs), outs
    assert len(create_scheduler("torchx").list()) == 12
