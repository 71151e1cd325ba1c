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

Files: ``$TORCHXCONFIG`` alone if set (it must exist), else ``./.torchxconfig`` then
``~/.torchxconfig``. Read and written as upstream's, with the differences listed in
docs/differences.md.
"""

from __future__ import annotations

import io
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, TextIO

from torchx.schedulers import get_scheduler_factories
from torchx.schedulers.api import Scheduler
from torchx.specs.api import (
    CfgVal,
    InvalidRunConfigException,
    TorchXError,
    get_type_name,
    runopt,
)

if TYPE_CHECKING:  # configparser is loaded only when a config file is read (~2 ms)
    import configparser

CONFIG_FILE = ".torchxconfig"
CONFIG_PREFIX_DELIM = ":"
ENV_TORCHXCONFIG = "TORCHXCONFIG"
# upstream's search list; find_configs() searches it as given only once a caller replaced it
DEFAULT_CONFIG_DIRS: List[str] = [str(Path.home()), str(Path.cwd())]
_IMPORT_TIME_DIRS: List[str] = list(DEFAULT_CONFIG_DIRS)
_NONE = "None"
_FIXME = "#FIXME"

logger = logging.getLogger(__name__)
log = logger  # upstream's name

__all__ = [
    "CONFIG_FILE",
    "CONFIG_PREFIX_DELIM",
    "DEFAULT_CONFIG_DIRS",
    "ENV_TORCHXCONFIG",
    "ConfigError",
    "apply",
    "dump",
    "dumps",
    "find_configs",
    "get_config",
    "get_configs",
    "get_configured_trackers",
    "get_scheduler_factories",
    "load",
    "load_sections",
]


class ConfigError(TorchXError, ValueError):
    """A ``.torchxconfig`` that is missing, unreadable or malformed (the message names it)."""


class ConfigFileNotFound(ConfigError, FileNotFoundError):
    """``$TORCHXCONFIG`` names a file that does not exist."""


def find_configs(dirs: Optional[Iterable[str]] = None) -> List[str]:
    """Config files in precedence order (first wins): ``$TORCHXCONFIG`` alone if set; else
    ``.torchxconfig`` in each of ``dirs`` (default: the cwd, then ``$HOME``)."""
    env = os.environ.get(ENV_TORCHXCONFIG)
    if env:
        if not os.path.isfile(env):
            raise ConfigFileNotFound(
                f"${ENV_TORCHXCONFIG} points at {env!r}, which is not a file;"
                f" create it or unset {ENV_TORCHXCONFIG}"
            )
        return [env]
    search = list(dirs or []) or _default_dirs()
    found: List[str] = []
    for d in search:
        path = os.path.join(d, CONFIG_FILE)
        if os.path.isfile(path) and os.path.abspath(path) not in map(os.path.abspath, found):
            found.append(path)
    return found


def _default_dirs() -> List[str]:
    if list(DEFAULT_CONFIG_DIRS) != _IMPORT_TIME_DIRS:
        return list(DEFAULT_CONFIG_DIRS)
    return [os.getcwd(), str(Path.home())]


def _new_parser(delimiters: tuple[str, ...]) -> configparser.ConfigParser:
    import configparser

    class CaseSensitive(configparser.ConfigParser):
        def optionxform(self, optionstr: str) -> str:
            return optionstr  # keys as written (ConfigParser lowercases them)

    return CaseSensitive(delimiters=delimiters, interpolation=None)


def _parse(text: str, source: str) -> configparser.ConfigParser:
    import configparser

    # "=" first (keys may hold ":"); a file that does not parse so may use "key: value"
    for delimiters in (("=",), ("=", ":")):
        parser = _new_parser(delimiters)
        try:
            parser.read_string(text, source=source)
            return parser
        except configparser.ParsingError as e:
            error: configparser.Error = e
        except configparser.Error as e:
            raise _parse_error(source, text, e) from None
    raise _parse_error(source, text, error) from None


def _parse_error(source: str, text: str, e: configparser.Error) -> ConfigError:
    """``e`` as one line naming the file, the line and what to do about it."""
    import configparser

    lineno: Optional[int] = getattr(e, "lineno", None)
    errors = getattr(e, "errors", None)  # ParsingError's (lineno, line) pairs
    if not lineno and errors:
        lineno = errors[0][0]
    lines = text.splitlines()
    where = f"{source}, line {lineno}" if lineno else source
    written = lines[lineno - 1].strip() if lineno and lineno <= len(lines) else ""
    if isinstance(e, configparser.MissingSectionHeaderError):
        what = f"{written!r} comes before any [section] header; put it under one"
    elif isinstance(e, configparser.ParsingError):
        what = f"cannot parse {written!r}; write KEY = VALUE under a [section] header"
    elif isinstance(e, configparser.DuplicateOptionError):
        what = f"{e.option!r} is set twice in [{e.section}]; keep one"
    elif isinstance(e, configparser.DuplicateSectionError):
        what = f"section [{e.section}] appears twice; merge the two"
    else:
        what = _first_line(e)
    return ConfigError(f"malformed {where}: {what}")


def _line_of(text: str, section: str, key: str) -> Optional[int]:
    """The line number of ``key`` in ``[section]`` of ``text``, for error messages."""
    current = None
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        header = re.fullmatch(r"\[(.+)\]", stripped)
        if header:
            current = header.group(1)
        elif current == section and stripped.startswith(key):
            if stripped[len(key) :].lstrip()[:1] in ("=", ":"):
                return n
    return None


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _not_text(source: str, e: UnicodeDecodeError) -> ConfigError:
    return ConfigError(
        f"{source} is not a text file (byte {e.start} is not {e.encoding});"
        " fix or remove it, or point $TORCHXCONFIG at another file"
    )


def _read_text(path: str) -> str:
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError as e:
        raise _not_text(path, e) from None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    if "\x00" in text:
        raise ConfigError(f"{path} is not a text file (it holds NUL bytes); fix or remove it")
    return text


def _read(path: str) -> configparser.ConfigParser:
    return _parse(_read_text(path), path)


def load_sections(prefix: str, dirs: Optional[Iterable[str]] = None) -> Dict[str, Dict[str, str]]:
    """``{name: {key: value}}`` for every ``[prefix:name]`` section (first file wins per key)."""
    sections: Dict[str, Dict[str, str]] = {}
    head = f"{prefix}{CONFIG_PREFIX_DELIM}"
    for parser in map(_read, find_configs(dirs)):
        for section in parser.sections():
            name = section[len(head) :]
            if section.startswith(head) and name:
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
    source = str(getattr(f, "name", CONFIG_FILE))
    try:
        text = f.read()
    except UnicodeDecodeError as e:
        raise _not_text(source, e) from None
    _apply_section(scheduler, text, cfg, source)


def _cast(opt: runopt, parser: configparser.ConfigParser, section: str, key: str) -> CfgVal:
    raw = parser.get(section, key)
    if opt.opt_type is bool:
        return parser.getboolean(section, key)  # 1/yes/true/on and 0/no/false/off
    if opt.is_type_list_of_str:
        return raw.split(";")
    return opt.cast_to_type(raw)


def _apply_section(scheduler: str, text: str, cfg: Dict[str, CfgVal], source: str) -> None:
    """Fill ``cfg`` from the ``[scheduler]`` section of ``text`` (read from ``source``). A key
    that is not one of the scheduler's run options is an error, as it is in ``-cfg``: a typo
    would otherwise leave the option at its default without a word."""
    parser = _parse(text, source)
    if not parser.has_section(scheduler):
        return
    opts = _scheduler(scheduler).run_opts()
    # keys the caller set are its own to check (-cfg's error names the -cfg key)
    section = {k: v for k, v in parser.items(scheduler) if k not in cfg}
    try:
        opts.check_known(section, scheduler)
    except InvalidRunConfigException as e:
        where = _where(source, text, scheduler, e.cfg_key)
        raise ConfigError(f"{where}: {e.invalid_reason}; fix or remove it") from None
    for key, raw in section.items():
        opt = opts.get(key)
        if opt is None or raw.startswith(_FIXME):
            continue  # (opt: checked above) dump()'s placeholder for a required option
        if raw == _NONE:
            cfg[key] = None
            continue
        try:
            cfg[key] = _cast(opt, parser, scheduler, key)
        except ValueError as e:
            where = _where(source, text, scheduler, key)
            raise ConfigError(
                f"{where}: [{scheduler}] {key} must be {get_type_name(opt.opt_type)}: {e}"
            ) from None


def _where(source: str, text: str, section: str, key: str) -> str:
    lineno = _line_of(text, section, key)
    return f"{source}, line {lineno}" if lineno else source


def _scheduler(name: str) -> Scheduler:
    factories = get_scheduler_factories()
    if name not in factories:
        raise ConfigError(
            f"{name!r} is not a registered scheduler; valid scheduler names:"
            f" {', '.join(sorted(factories))}"
        )
    return factories[name](session_name="_")


def apply(scheduler: str, cfg: Dict[str, CfgVal], dirs: Optional[Iterable[str]] = None) -> None:
    """Fill ``cfg`` (in place) with ``.torchxconfig`` defaults; keys already set win."""
    for path in find_configs(dirs):
        _apply_section(scheduler, _read_text(path), cfg, path)
        logger.debug("loaded configs from %s", path)


def _fixme_placeholder(opt: runopt, max_len: int = 60) -> str:
    ph = f"{_FIXME}:({get_type_name(opt.opt_type)}) {opt.help}"
    return ph if len(ph) <= max_len else f"{ph[:max_len]}..."


def _format_value(value: CfgVal) -> str:
    if isinstance(value, list):
        return ";".join(value) if value else _NONE
    if isinstance(value, dict):
        return ";".join(f"{k}:{v}" for k, v in value.items()) if value else _NONE
    return str(value)


def dump(f: TextIO, schedulers: Optional[List[str]] = None, required_only: bool = False) -> None:
    """Write a ``.torchxconfig`` with a ``[scheduler]`` section per scheduler (all if None).

    Optional options get their defaults; required ones a ``#FIXME:(type) help``
    placeholder to replace. Schedulers whose optional dependencies are missing are
    skipped; an unknown scheduler name raises :class:`ConfigError`.
    """
    from torchx.util.modules import MissingExtraError

    names = schedulers or list(get_scheduler_factories())
    parser = _new_parser(("=",))
    for name in names:
        try:
            opts = _scheduler(name).run_opts()
        except (MissingExtraError, ModuleNotFoundError) as e:
            logger.info("skipping [%s] in the config: %s", name, e)
            continue
        parser.add_section(name)
        for key, opt in opts:
            if opt.is_required:
                parser.set(name, key, _fixme_placeholder(opt))
            elif not required_only:
                parser.set(name, key, _format_value(opt.default))
    parser.write(f, space_around_delimiters=True)


def dumps(schedulers: Optional[List[str]] = None, required_only: bool = False) -> str:
    buf = io.StringIO()
    dump(buf, schedulers, required_only)
    return buf.getvalue()


def get_configured_trackers(dirs: Optional[Iterable[str]] = None) -> Dict[str, Optional[str]]:
    """``{tracker name: config}``: ``$TORCHX_TRACKERS`` or the keys of ``[torchx:tracker]``;
    each config from ``$TORCHX_TRACKER_<NAME>_CONFIG`` or ``[tracker:NAME] config``."""
    from torchx.trackers.env import ENV_TORCHX_TRACKERS, tracker_config_env_var_name

    env_names = os.environ.get(ENV_TORCHX_TRACKERS)
    if env_names is not None:
        names = [n.strip() for n in env_names.split(",") if n.strip()]
    else:
        names = list(get_configs("torchx", "tracker", dirs))
    trackers: Dict[str, Optional[str]] = {}
    for name in names:
        env_cfg = os.environ.get(tracker_config_env_var_name(name))
        trackers[name] = (
            env_cfg if env_cfg is not None else get_config("tracker", name, "config", dirs)
        )
    return trackers
