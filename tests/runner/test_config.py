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
    with pytest.raises(config.ConfigError, match="missing.ini") as e:
        config.find_configs()
    assert isinstance(e.value, FileNotFoundError)  # what upstream raised


def test_malformed_file_is_one_line_error(tmp_path: Path) -> None:
    _write(tmp_path / "proj" / ".torchxconfig", "this is not ini\n[x\n")
    with pytest.raises(config.ConfigError) as e:
        config.get_configs("cli", "run")
    assert "malformed" in str(e.value) and "\n" not in str(e.value)


def _read_error(reader: str, path: Path) -> pytest.ExceptionInfo[config.ConfigError]:
    """The error ``reader`` (each way a config is read) raises on the config ``path``."""
    with pytest.raises(config.ConfigError) as e:
        if reader == "apply":
            config.apply("local_cwd", {})
        elif reader == "get_configs":
            config.get_configs("component", "utils.echo")
        else:
            with open(path) as f:
                config.load("local_cwd", f, {})
    return e


@pytest.mark.parametrize(
    "text, line, needle",
    [
        ("[local_cwd]\nlog_dir = /tmp\nthis is junk\n", 3, "cannot parse 'this is junk'"),
        ("# c\nlog_dir = /tmp\n", 2, "'log_dir = /tmp' comes before any [section] header"),
        ("[local_cwd]\nlog_dir = /a\n\nlog_dir = /b\n", 4, "'log_dir' is set twice"),
        ("[local_cwd]\n[cli:run]\n[local_cwd]\n", 3, "section [local_cwd] appears twice"),
    ],
)
@pytest.mark.parametrize("reader", ["apply", "get_configs", "load"])
def test_parse_errors_name_the_file_and_line(
    tmp_path: Path, text: str, line: int, needle: str, reader: str
) -> None:
    path = _write(tmp_path / "proj" / ".torchxconfig", text)
    e = _read_error(reader, path)
    message = str(e.value)
    assert message.startswith(f"malformed {path}, line {line}: "), message
    assert needle in message and "\n" not in message


@pytest.mark.parametrize("value", ["1", "None", "#FIXME:(str) x"])
def test_an_unknown_scheduler_key_is_an_error_naming_file_and_line(
    tmp_path: Path, value: str
) -> None:
    path = _write(
        tmp_path / "proj" / ".torchxconfig",
        f"[component:utils.echo]\nlog_dri = x\n[local_cwd]\nlog_dir = /tmp/x\nlog_dri = {value}\n",
    )
    with pytest.raises(config.ConfigError) as e:
        config.apply("local_cwd", {})
    # -cfg's message (runopts.check_known), with where it was written
    assert str(e.value) == (
        f"{path}, line 5: Unknown run option 'log_dri' (did you mean 'log_dir'?); valid options"
        " of the local_cwd scheduler are: auto_set_cuda_visible_devices, log_dir, prepend_cwd;"
        " fix or remove it"
    )
    assert isinstance(e.value, ValueError)
    cfg: dict = {"log_dri": "given"}  # a key the caller gives is the caller's to check (-cfg)
    config.apply("local_cwd", cfg)
    assert cfg == {"log_dri": "given", "log_dir": "/tmp/x"}


def test_sections_torchx_does_not_own_keep_working(tmp_path: Path) -> None:
    """Component defaults, CLI defaults, trackers and other tools' sections take any key;
    another scheduler's section is checked only when that scheduler is used."""
    _write(
        tmp_path / "proj" / ".torchxconfig",
        "[component:utils.echo]\nmsg = hi\nanything = 1\n[cli:run]\nscheduler = local_cwd\n"
        "[torchx:tracker]\nmlflow =\n[tracker:mlflow]\nconfig = sqlite:///x.db\n"
        "[some_other_tool]\nkey = v\n[slurm]\nno_such = 1\n[local_cwd]\nlog_dir = /tmp/l\n",
    )
    cfg: dict = {}
    config.apply("local_cwd", cfg)
    assert cfg == {"log_dir": "/tmp/l"}
    assert config.get_configs("component", "utils.echo") == {"msg": "hi", "anything": "1"}
    assert config.get_config("cli", "run", "scheduler") == "local_cwd"
    assert config.get_configured_trackers() == {"mlflow": "sqlite:///x.db"}
    with pytest.raises(config.ConfigError, match="line 13: Unknown run option 'no_such'"):
        config.apply("slurm", {})


def test_mistyped_values_are_errors_naming_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "proj" / ".torchxconfig", "[local_cwd]\n\nprepend_cwd = maybe\n")
    with pytest.raises(config.ConfigError, match="prepend_cwd") as e:
        config.apply("local_cwd", {})
    assert str(e.value).startswith(f"{path}, line 3: [local_cwd] prepend_cwd must be bool")
    assert isinstance(e.value, ValueError)  # what upstream raised


def test_values_read_as_upstream_reads_them(tmp_path: Path) -> None:
    _write(
        tmp_path / "proj" / ".torchxconfig",
        "[slurm]\nexclusive = yes\npartition = None\n"
        "[aws_batch]\nqueue = #FIXME:(str) the queue\npriority = 3\nuser = a%b\n",
    )
    cfg: dict = {}
    config.apply("slurm", cfg)
    assert cfg == {"exclusive": True, "partition": None}
    cfg = {}
    config.apply("aws_batch", cfg)
    assert cfg == {"priority": 3, "user": "a%b"}  # the FIXME placeholder counts as unset


@pytest.mark.parametrize("reader", ["apply", "get_configs", "load"])
def test_a_binary_config_is_a_one_line_error_naming_the_file(tmp_path: Path, reader: str) -> None:
    path = tmp_path / "proj" / ".torchxconfig"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    e = _read_error(reader, path)
    assert str(path) in str(e.value) and "not a text file" in str(e.value)
    assert "\n" not in str(e.value)


def test_upstream_names() -> None:
    assert config.CONFIG_PREFIX_DELIM == ":"
    assert len(config.DEFAULT_CONFIG_DIRS) == 2  # upstream: [$HOME, $CWD] at import
    assert "local_cwd" in config.get_scheduler_factories()
    with pytest.raises(ValueError, match="'nope' is not a registered scheduler"):
        config.dump(io.StringIO(), schedulers=["nope"])


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


def test_dump_writes_upstreams_format_and_load_reads_it_back() -> None:
    buf = io.StringIO()
    config.dump(buf, schedulers=["local_cwd", "aws_batch"])
    text = buf.getvalue()
    assert text.startswith(
        "[local_cwd]\nlog_dir = None\nprepend_cwd = False\nauto_set_cuda_visible_devices = False"
        "\n\n[aws_batch]\nqueue = #FIXME:(str) the AWS Batch job queue to submit to\n"
    )
    cfg: dict = {}
    config.load("local_cwd", io.StringIO(text), cfg)
    assert cfg == {"log_dir": None, "prepend_cwd": False, "auto_set_cuda_visible_devices": False}
    required = io.StringIO()
    config.dump(required, schedulers=["aws_batch"], required_only=True)
    assert required.getvalue() == (
        "[aws_batch]\nqueue = #FIXME:(str) the AWS Batch job queue to submit to\n\n"
    )
