"""``.torchxconfig``: INI defaults for run options, component args, CLI flags and trackers.

Sections (upstream-compatible)::

    [local_cwd]                 # run option defaults of a scheduler
    log_dir = /tmp/logs
    [component:dist.ddp]        # component argument defaults
    j = 2x8
    [cli:run]                   # CLI flag defaults (component, scheduler, ...)
    scheduler = local_cwd
    [torchx:tracker]            # trackers: one key per tracker (name or module:fn)
    mlflow =
    [tracker:mlflow]
    config = sqlite:////tmp/mlflow.db

Files: ``$TORCHXCONFIG`` alone if set (it must exist), else ``./.torchxconfig``
then ``~/.torchxconfig``. Differences from upstream, on purpose: the project file
in the cwd wins over the one in $HOME (like git's local over global config), and
keys may contain ``:`` (``mod:fn = ...``; torchx#802), values being split on ``=``.
"""

from __future__ import annotations

import configparser
import io
import os
from pathlib import Path
from typing import Dict, Iterable, List, Optional, TextIO

from torchx.specs.api import CfgVal, TorchXError, get_type_name, runopts

CONFIG_FILE = ".torchxconfig"
ENV_TORCHXCONFIG = "TORCHXCONFIG"
_NONE = "None"


class ConfigError(TorchXError):
    """A ``.torchxconfig`` that is missing, unreadable or malformed."""


def find_configs(dirs: Optional[Iterable[str]] = None) -> List[str]:
    """Config files in precedence order (first wins)."""
    env = os.environ.get(ENV_TORCHXCONFIG)
    if env:
        if not os.path.isfile(env):
            raise ConfigError(f"${ENV_TORCHXCONFIG} points at {env!r}, which is not a file")
        return [env]
    search = list(dirs) if dirs is not None else [os.getcwd(), str(Path.home())]
    found: List[str] = []
    for d in search:
        path = os.path.join(d, CONFIG_FILE)
        if os.path.isfile(path) and os.path.abspath(path) not in map(os.path.abspath, found):
            found.append(path)
    return found


def _new_parser(delimiters: tuple[str, ...]) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(delimiters=delimiters, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment, method-assign]  # keys are case-sensitive
    return parser


def _parse(text: str, source: str) -> configparser.ConfigParser:
    try:
        parser = _new_parser(("=",))
        parser.read_string(text, source=source)
        return parser
    except configparser.ParsingError:
        pass  # maybe written with "key: value": retry with both delimiters
    except configparser.Error as e:
        raise ConfigError(f"malformed {source}: {_first_line(e)}") from None
    try:
        parser = _new_parser(("=", ":"))
        parser.read_string(text, source=source)
        return parser
    except configparser.Error as e:
        raise ConfigError(f"malformed {source}: {_first_line(e)}") from None


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _read(path: str) -> configparser.ConfigParser:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    return _parse(text, path)


def _parsers(dirs: Optional[Iterable[str]]) -> List[configparser.ConfigParser]:
    return [_read(p) for p in find_configs(dirs)]


def load_sections(prefix: str, dirs: Optional[Iterable[str]] = None) -> Dict[str, Dict[str, str]]:
    """``{name: {key: value}}`` for every ``[prefix:name]`` section (first file wins per key)."""
    sections: Dict[str, Dict[str, str]] = {}
    for parser in _parsers(dirs):
        for section in parser.sections():
            if section.startswith(f"{prefix}:"):
                name = section[len(prefix) + 1 :]
                into = sections.setdefault(name, {})
                for key, value in parser.items(section):
                    into.setdefault(key, value)
    return sections


def get_configs(prefix: str, name: str, dirs: Optional[Iterable[str]] = None) -> Dict[str, str]:
    """The keys of ``[prefix:name]`` merged over all config files."""
    return load_sections(prefix, dirs).get(name, {})


def get_config(
    prefix: str, name: str, key: str, dirs: Optional[Iterable[str]] = None
) -> Optional[str]:
    return get_configs(prefix, name, dirs).get(key)


def load(scheduler: str, f: TextIO, cfg: Dict[str, CfgVal]) -> None:
    """Fill ``cfg`` with the ``[scheduler]`` section of ``f``; keys already set win."""
    parser = _parse(f.read(), getattr(f, "name", CONFIG_FILE))
    _apply_section(scheduler, parser, cfg, getattr(f, "name", CONFIG_FILE))


def _apply_section(
    scheduler: str, parser: configparser.ConfigParser, cfg: Dict[str, CfgVal], source: str
) -> None:
    if not parser.has_section(scheduler):
        return
    opts = _scheduler_runopts(scheduler)
    for key, raw in parser.items(scheduler):
        if key in cfg:
            continue
        opt = opts.get(key) if opts is not None else None
        if opts is not None and opt is None:
            known = ", ".join(k for k, _ in opts) or "(none)"
            raise ConfigError(f"{source}: [{scheduler}] has unknown option {key!r}; valid: {known}")
        if raw == _NONE:
            cfg[key] = None
        elif opt is None:
            cfg[key] = raw
        else:
            try:
                cfg[key] = opt.cast_to_type(raw)
            except ValueError as e:
                raise ConfigError(
                    f"{source}: [{scheduler}] {key} must be {get_type_name(opt.opt_type)}: {e}"
                ) from None


def _scheduler_runopts(scheduler: str) -> Optional[runopts]:
    from torchx.schedulers import get_scheduler_factories
    from torchx.util.modules import MissingExtraError

    factory = get_scheduler_factories().get(scheduler)
    if factory is None:
        return None
    try:
        return factory("torchx").run_opts()
    except MissingExtraError:
        return None


def apply(scheduler: str, cfg: Dict[str, CfgVal], dirs: Optional[Iterable[str]] = None) -> None:
    """Fill ``cfg`` (in place) with ``.torchxconfig`` defaults; keys already set win."""
    for path in find_configs(dirs):
        _apply_section(scheduler, _read(path), cfg, path)


def dump(f: TextIO, schedulers: Optional[List[str]] = None, required_only: bool = False) -> None:
    """Write a ``.torchxconfig`` skeleton with each scheduler's options and their help."""
    from torchx.schedulers import get_scheduler_factories
    from torchx.util.modules import MissingExtraError

    factories = get_scheduler_factories()
    names = schedulers or sorted(factories)
    for name in names:
        if name not in factories:
            from torchx.specs.api import UnknownSchedulerException

            raise UnknownSchedulerException(name, sorted(factories))
        try:
            opts = factories[name]("torchx").run_opts()
        except MissingExtraError as e:
            f.write(f"# [{name}] skipped: {e}\n\n")
            continue
        lines = []
        for key, opt in opts:
            if required_only and not opt.is_required:
                continue
            help_line = " ".join(opt.help.split())
            if opt.is_required:
                lines.append(f"#FIXME:({get_type_name(opt.opt_type)}) {help_line}\n{key} =\n")
            else:
                default = _format_value(opt.default)
                lines.append(f"# ({get_type_name(opt.opt_type)}) {help_line}\n{key} = {default}\n")
        f.write(f"[{name}]\n" + "".join(lines) + "\n")


def _format_value(value: CfgVal) -> str:
    if value is None:
        return _NONE
    if isinstance(value, list):
        return ";".join(value)
    if isinstance(value, dict):
        return ";".join(f"{k}:{v}" for k, v in value.items())
    return str(value)


def dumps(schedulers: Optional[List[str]] = None, required_only: bool = False) -> str:
    buf = io.StringIO()
    dump(buf, schedulers, required_only)
    return buf.getvalue()


def get_configured_trackers(dirs: Optional[Iterable[str]] = None) -> Dict[str, Optional[str]]:
    """``{tracker name: config}``.

    From ``$TORCHX_TRACKERS`` or ``[torchx:tracker]`` + ``[tracker:NAME]``.
    """
    env_names = os.environ.get("TORCHX_TRACKERS")
    names: List[str]
    if env_names is not None:
        names = [n.strip() for n in env_names.split(",") if n.strip()]
    else:
        names = list(get_configs("torchx", "tracker", dirs).keys())
    trackers: Dict[str, Optional[str]] = {}
    for name in names:
        from torchx.trackers.api import tracker_config_env_var_name

        env_cfg = os.environ.get(tracker_config_env_var_name(name))
        trackers[name] = (
            env_cfg if env_cfg is not None else get_config("tracker", name, "config", dirs)
        )
    return trackers
