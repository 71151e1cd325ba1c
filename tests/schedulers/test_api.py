"""The checks every scheduler's submit goes through (``Scheduler.submit_dryrun``)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Mapping, Optional

import pytest

from torchx import specs
from torchx.runner import get_runner
from torchx.schedulers import get_scheduler_factories
from torchx.schedulers.api import InvalidAppError, ListAppResponse, Scheduler, validate_env_names
from torchx.specs import AppDryRunInfo, CfgVal


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    monkeypatch.delenv("TORCHX_TRACKERS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)


def _app(env: Dict[str, str]) -> specs.AppDef:
    role = specs.Role(
        name="worker",
        image="ghcr.io/pytorch/torchx:0.7.0",
        entrypoint="sh",
        args=["-c", "true"],
        env=env,
        resource=specs.resource(cpu=1),
    )
    return specs.AppDef(name="job", roles=[role])


BAD_NAMES = ["BAD NAME", "A=B", "1X", "X\x00Y", "", "A-B", "A.B", "É"]


def _cfg(scheduler: str) -> dict:
    """A dummy value for each required run option (aws_batch's queue)."""
    opts = get_scheduler_factories()[scheduler](session_name="t").run_opts()
    return {key: "x" for key, opt in opts if opt.is_required}


@pytest.mark.parametrize("scheduler", sorted(get_scheduler_factories()))
@pytest.mark.parametrize("name", BAD_NAMES)
def test_every_scheduler_refuses_a_bad_env_name_at_dryrun(scheduler: str, name: str) -> None:
    sched = get_scheduler_factories()[scheduler](session_name="t")
    with pytest.raises(InvalidAppError) as e:
        sched.submit_dryrun(_app({"GOOD": "1", name: "1"}), _cfg(scheduler))
    message = str(e.value)
    assert f"env var name {name!r} of role 'worker' is not valid" in message
    assert "letters, digits and '_'" in message and "\n" not in message


@pytest.mark.parametrize("scheduler", ["local_cwd", "slurm"])
def test_identifier_names_pass(scheduler: str) -> None:
    sched = get_scheduler_factories()[scheduler](session_name="t")
    env = {"A": "1", "_x": "2", "LONG_NAME_9": "has spaces = and more", "a1": ""}
    info = sched.submit_dryrun(_app(env), {})
    assert info.app is not None and info.app.roles[0].env == env


class _PluginScheduler(Scheduler[str]):
    """A plugin scheduler whose ``_validate`` does not call the base's (as local_cwd's)."""

    def _validate(
        self, app: specs.AppDef, scheduler: str, cfg: Optional[Mapping[str, CfgVal]] = None
    ) -> None:
        pass

    def _submit_dryrun(self, app: specs.AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[str]:
        return AppDryRunInfo("request", str)

    def schedule(self, dryrun_info: AppDryRunInfo[str]) -> str:
        raise AssertionError("never submitted")

    def describe(self, app_id: str) -> None:
        return None

    def list(self) -> List[ListAppResponse]:
        return []

    def _cancel_existing(self, app_id: str) -> None:
        pass


def test_checked_where_a_scheduler_overrides_validate() -> None:
    """local_cwd's and a plugin's ``_validate`` skip the base's: submit_dryrun checks."""
    sched = _PluginScheduler("plugin", "t")
    assert sched.submit_dryrun(_app({"OK": "1"}), {}).request == "request"
    for bad in ({"BAD NAME": "1"}, {"1X": "1"}):
        with pytest.raises(InvalidAppError, match="env var name"):
            sched.submit(_app(bad), {})


def test_runner_refuses_before_building_or_submitting(tmp_path: Path) -> None:
    (tmp_path / "marker.txt").write_text("x")
    with get_runner() as runner:
        with pytest.raises(InvalidAppError, match="'BAD NAME'"):
            runner.dryrun(_app({"BAD NAME": "1"}), "local_cwd", workspace=str(tmp_path))
        with pytest.raises(InvalidAppError, match="'1X'"):
            runner.run(_app({"1X": "1"}), "local_cwd")
        assert runner.list("local_cwd") == []


def test_validate_env_names_directly() -> None:
    validate_env_names(_app({"OK_1": "v"}))
    with pytest.raises(InvalidAppError, match="'A=B'"):
        validate_env_names(_app({"A=B": "v"}))
    assert issubclass(InvalidAppError, specs.TorchXError)  # the CLI prints it as one line
