"""`.torchxconfig` discovery, precedence, typing and error messages."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from torchx.runner import config


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHXCONFIG", raising=False)
    monkeypatch.delenv("TORCHX_TRACKERS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "proj").mkdir()
    monkeypatch.chdir(tmp_path / "proj")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_scheduler_section_is_typed_and_given_keys_win(tmp_path: Path) -> None:
    _write(
        tmp_path / "proj" / ".torchxconfig", "[local_cwd]\nlog_dir = /tmp/x\nprepend_cwd = true\n"
    )
    cfg: dict = {"log_dir": "/given"}
    config.apply("local_cwd", cfg)
    assert cfg == {"log_dir": "/given", "prepend_cwd": True}


def test_cwd_file_wins_over_home(tmp_path: Path) -> None:
    _write(tmp_path / "home" / ".torchxconfig", "[component:utils.echo]\nmsg = home\nimage = h\n")
    _write(tmp_path / "proj" / ".torchxconfig", "[component:utils.echo]\nmsg = proj\n")
    assert config.get_configs("component", "utils.echo") == {"msg": "proj", "image": "h"}


def test_torchxconfig_env_is_exclusive_and_must_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path / "proj" / ".torchxconfig", "[cli:run]\nscheduler = nope\n")
    other = _write(tmp_path / "other.ini", "[cli:run]\nscheduler = local_cwd\n")
    monkeypatch.setenv("TORCHXCONFIG", str(other))
    assert config.get_config("cli", "run", "scheduler") == "local_cwd"
    monkeypatch.setenv("TORCHXCONFIG", str(tmp_path / "missing.ini"))
    with pytest.raises(config.ConfigError, match="missing.ini"):
        config.find_configs()


def test_malformed_file_is_one_line_error(tmp_path: Path) -> None:
    _write(tmp_path / "proj" / ".torchxconfig", "this is not ini\n[x\n")
    with pytest.raises(config.ConfigError) as e:
        config.get_configs("cli", "run")
    assert "malformed" in str(e.value) and "\n" not in str(e.value)


def test_unknown_and_mistyped_options_are_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path / "proj" / ".torchxconfig", "[local_cwd]\nno_such_opt = 1\n")
    with pytest.raises(config.ConfigError, match="no_such_opt"):
        config.apply("local_cwd", {})
    path.write_text("[local_cwd]\nprepend_cwd = maybe\n")
    with pytest.raises(config.ConfigError, match="prepend_cwd"):
        config.apply("local_cwd", {})


def test_colon_keys_and_colon_syntax(tmp_path: Path) -> None:
    _write(
        tmp_path / "proj" / ".torchxconfig",
        "[torchx:tracker]\nmy.mod:create =\nmlflow =\n[tracker:mlflow]\nconfig = sqlite:///x.db\n",
    )
    assert config.get_configured_trackers() == {"my.mod:create": None, "mlflow": "sqlite:///x.db"}
    (tmp_path / "proj" / ".torchxconfig").write_text("[component:dist.ddp]\nj: 2x8\n")
    assert config.get_configs("component", "dist.ddp") == {"j": "2x8"}


def test_trackers_from_env_override_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "proj" / ".torchxconfig", "[torchx:tracker]\nmlflow =\n")
    monkeypatch.setenv("TORCHX_TRACKERS", "fsspec")
    monkeypatch.setenv("TORCHX_TRACKER_FSSPEC_CONFIG", "memory://t")
    assert config.get_configured_trackers() == {"fsspec": "memory://t"}


def test_dump_writes_loadable_config() -> None:
    buf = io.StringIO()
    config.dump(buf, schedulers=["local_cwd"])
    text = buf.getvalue()
    assert "[local_cwd]" in text and "log_dir = None" in text
    cfg: dict = {}
    config.load("local_cwd", io.StringIO(text), cfg)
    assert cfg["log_dir"] is None and cfg["prepend_cwd"] is False
