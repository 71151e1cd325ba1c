"""Runner against the real local_cwd scheduler (real processes)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Optional

import pytest

from torchx import specs
from torchx.runner import get_runner
from torchx.runner.config import ConfigError
from torchx.schedulers.api import InvalidAppError


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    monkeypatch.delenv("TORCHX_TRACKERS", raising=False)
    monkeypatch.delenv("TORCHX_PARENT_RUN_ID", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)


def _sh(script: str, name: str = "job", num_replicas: int = 1) -> specs.AppDef:
    return specs.AppDef(
        name=name,
        roles=[
            specs.Role(
                name="worker",
                image=".",
                entrypoint="sh",
                args=["-c", script],
                num_replicas=num_replicas,
                resource=specs.resource(cpu=1),
            )
        ],
    )


def test_run_wait_and_logs() -> None:
    with get_runner() as runner:
        handle = runner.run(_sh("echo hello; echo to-stderr >&2"), "local_cwd")
        assert handle.startswith("local_cwd://torchx/job-")
        status = runner.wait(handle, wait_interval=0.1, timeout=60)
        assert status is not None and status.state == specs.AppState.SUCCEEDED
        out = list(runner.log_lines(handle, "worker", 0, streams=None))
        assert "hello\n" in out and "to-stderr\n" in out
        apps = runner.list("local_cwd")
        assert handle in [a.app_handle for a in apps]


def test_injects_job_env_without_mutating_the_callers_app(monkeypatch: pytest.MonkeyPatch) -> None:
    app = _sh('echo "job=$TORCHX_JOB_ID parent=$TORCHX_PARENT_RUN_ID"')
    before = repr(app)
    with get_runner() as runner:
        handle = runner.run(app, "local_cwd", parent_run_id="pipeline-1")
        runner.wait(handle, timeout=60)
        line = "".join(runner.log_lines(handle, "worker"))
    assert repr(app) == before
    assert f"job={handle} parent=pipeline-1" in line


def test_wait_returns_when_the_job_ends_not_after_wait_interval() -> None:
    with get_runner() as runner:
        handle = runner.run(_sh("sleep 0.3"), "local_cwd")
        result: list = []
        t = threading.Thread(target=lambda: result.append(runner.wait(handle, wait_interval=600)))
        t.start()
        t.join(timeout=60)  # far below wait_interval: wait must not sleep it out
        assert not t.is_alive(), "Runner.wait slept out its wait_interval"
        assert result[0].state == specs.AppState.SUCCEEDED


def test_failed_app_reports_failure_and_raise_for_status() -> None:
    with get_runner() as runner:
        handle = runner.run(_sh("echo boom >&2; exit 3"), "local_cwd")
        status = runner.wait(handle, timeout=60)
        assert status is not None and status.state == specs.AppState.FAILED
        with pytest.raises(specs.AppStatusError):
            status.raise_for_status()


def test_cancel_running_app() -> None:
    with get_runner() as runner:
        handle = runner.run(_sh("sleep 600", num_replicas=2), "local_cwd")
        runner.cancel(handle)
        status = runner.wait(handle, timeout=60)
        assert status is not None and status.state == specs.AppState.CANCELLED
        runner.cancel(handle)  # idempotent


def test_run_component_with_list_and_dict_args() -> None:
    with get_runner() as runner:
        h1 = runner.run_component("utils.echo", ["--msg", "from-list"], "local_cwd")
        h2 = runner.run_component("utils.echo", {"msg": "from-dict"}, "local_cwd")
        for handle, msg in ((h1, "from-list"), (h2, "from-dict")):
            assert runner.wait(handle, timeout=60).state == specs.AppState.SUCCEEDED
            assert msg + "\n" in list(runner.log_lines(handle, "echo"))


def test_component_defaults_from_torchxconfig(tmp_path: Path) -> None:
    (tmp_path / ".torchxconfig").write_text("[component:utils.echo]\nmsg = from-config\n")
    with get_runner() as runner:
        info = runner.dryrun_component("utils.echo", [], "local_cwd")
        assert info._app is not None and "from-config" in info._app.roles[0].args


@pytest.mark.parametrize("key", [None, "stage-1"])
def test_a_misspelled_run_option_is_an_error_and_launches_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, key: Optional[str]
) -> None:
    """Through the Python API (keyed or not) as through the CLI. A .torchxconfig shared by
    several schedulers keeps working: other schedulers' sections are not read; an unknown
    key in this scheduler's own section is an error too, naming its file and line."""
    logs = tmp_path / "logs"
    (tmp_path / ".torchxconfig").write_text(
        f"[local_cwd]\nlog_dir = {logs}\nlog_dri = stale\n[slurm]\npartition = gpu\n"
    )
    app = _sh("echo ran")
    want = (
        r"Unknown run option 'log_dri' \(did you mean 'log_dir'\?\); valid options of the"
        r" local_cwd scheduler are: auto_set_cuda_visible_devices, log_dir, prepend_cwd\."
    )
    with get_runner() as runner:
        with pytest.raises(specs.InvalidRunConfigException, match=want):
            runner.run(app, "local_cwd", cfg={"log_dri": "x"}, idempotency_key=key)
        with pytest.raises(specs.InvalidRunConfigException, match=want):
            runner.dryrun(app, "local_cwd", cfg={"log_dri": "x"})
        with pytest.raises(ConfigError, match=r"torchxconfig, line 3: Unknown run option"):
            runner.run(app, "local_cwd", idempotency_key=key)
        assert runner.list("local_cwd") == []
        (tmp_path / ".torchxconfig").write_text(
            f"[local_cwd]\nlog_dir = {logs}\n[slurm]\npartition = gpu\n"
        )
        handle = runner.run(app, "local_cwd", idempotency_key=key)
        status = runner.wait(handle, wait_interval=0.1, timeout=60)
    assert status is not None and status.state == specs.AppState.SUCCEEDED
    assert list(logs.rglob("*")), "the config's log_dir was not used"


def test_bad_inputs() -> None:
    with get_runner() as runner:
        with pytest.raises(specs.UnknownSchedulerException, match="local_cwd"):
            runner.run(_sh("true"), "nope")
        with pytest.raises(specs.MalformedAppHandleException):
            runner.status("not-a-handle")
        assert runner.status("local_cwd://torchx/never-ran-123") is None
        assert runner.wait("local_cwd://torchx/never-ran-123") is None
        with pytest.raises(specs.UnknownAppException):
            runner.log_lines("local_cwd://torchx/never-ran-123", "worker")
        with pytest.raises(specs.UnknownAppException):
            runner.cancel("local_cwd://torchx/never-ran-123")
        with pytest.raises(InvalidAppError, match="no roles"):
            runner.dryrun(specs.AppDef(name="empty"), "local_cwd")
        with pytest.raises(InvalidAppError, match="entrypoint"):
            runner.dryrun(
                specs.AppDef(name="x", roles=[specs.Role(name="r", image=".")]), "local_cwd"
            )
        with pytest.raises(InvalidAppError, match="num_replicas"):
            runner.dryrun(_sh("true", num_replicas=0), "local_cwd")
        with pytest.raises(specs.InvalidRunConfigException, match="nope"):
            runner.cfg_from_str("local_cwd", "nope=1")


def test_describe_from_a_new_runner() -> None:
    with get_runner() as runner:
        handle = runner.run(_sh("true"), "local_cwd")
        runner.wait(handle, timeout=60)
    with get_runner() as other:
        app = other.describe(handle)
        assert app is not None and app.roles[0].name == "worker"
