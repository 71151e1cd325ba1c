"""torchrun's own flags, read from the installed torch's parser so the two never drift.

Importing torch costs 2-3 s of CPU, so the flags are described once per torch install in
``$TORCHX_HOME/cache/`` (keyed by torch's ``run.py``) and rebuilt from that afterwards.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

from torchx.specs.errors import TorchXError
from torchx.util.paths import torchx_home, write_private

# bump when Flag changes: older descriptions are then read again from torch
_FORMAT = 1
ENV_PREFIX = "PET_"
_TYPES: Dict[str, Callable[[str], Any]] = {"str": str, "int": int, "float": float}


class _AddsArguments(Protocol):
    """An ``argparse`` parser or argument group."""

    def add_argument(self, *args: Any, **kwargs: Any) -> Any: ...


class TorchNotInstalledError(TorchXError):
    """torch (``torch.distributed.run``) is not importable in this Python."""


@dataclass(frozen=True)
class Flag:
    """One optional argument of ``torchrun`` as torch declares it."""

    option_strings: Tuple[str, ...]
    dest: str
    takes_value: bool
    type: str  # a key of _TYPES; any other converter of torch's is kept as the raw string
    default: Any  # as declared (before any PET_ variable)
    choices: Optional[Tuple[str, ...]]
    help: str
    env: bool  # torchrun also reads it from PET_<DEST>

    @property
    def env_name(self) -> str:
        return ENV_PREFIX + self.dest.upper()

    def default_here(self) -> Any:
        """The default torchrun would use in this process's environment."""
        if not self.env or self.env_name not in os.environ:
            return self.default
        value = os.environ[self.env_name]
        return bool(int(value or "0")) if not self.takes_value else value


def torchrun_flags() -> List[Flag]:
    """The optional arguments of the installed torch's ``torchrun`` (``-h`` left out)."""
    run_py = _torch_run_py()
    stat = run_py.stat()
    key = hashlib.sha256(
        f"{_FORMAT} {run_py} {stat.st_mtime_ns} {stat.st_size} {sys.version}".encode()
    ).hexdigest()[:16]
    cache = torchx_home() / "cache" / f"torchrun-flags-{key}.json"
    try:
        return [_flag_from_json(d) for d in json.loads(cache.read_text())]
    except (OSError, ValueError, TypeError, KeyError):
        pass  # not described yet (or a damaged file): read torch's parser
    flags, exact = _flags_from_torch()
    if exact:
        try:
            write_private(cache, json.dumps([asdict(f) for f in flags]))  # atomic
        except OSError:  # a read-only home: read torch again next time
            pass
    return flags


def add_flags(parser: _AddsArguments, flags: List[Flag], unset: Tuple[str, ...] = ()) -> None:
    """Add ``flags`` to ``parser`` as torchrun declares them; those named in ``unset``
    default to None (not given) instead of torchrun's default, so the caller can tell."""
    for f in flags:
        default = f.default_here()
        if f.dest in unset and not (f.env and f.env_name in os.environ):
            default = None
        if f.takes_value:
            parser.add_argument(
                *f.option_strings,
                dest=f.dest,
                type=_TYPES.get(f.type, str),
                default=default,
                choices=list(f.choices) if f.choices else None,
                help=f.help,
            )
        else:
            parser.add_argument(
                *f.option_strings, dest=f.dest, action="store_true", default=default, help=f.help
            )


def _torch_run_py() -> Path:
    spec = importlib.util.find_spec("torch")  # finds the package without importing it
    locations = list(spec.submodule_search_locations or []) if spec else []
    run_py = Path(locations[0]) / "distributed" / "run.py" if locations else None
    if run_py is None or not run_py.is_file():
        raise TorchNotInstalledError(
            "torchx torchrun takes torchrun's flags from torch, which is not installed in"
            f" this Python ({sys.executable}): pip install torch"
        )
    return run_py


def _flags_from_torch() -> Tuple[List[Flag], bool]:
    """The flags of torch's parser, and whether their defaults are the declared ones (a
    ``PET_`` variable set here replaces a declared default, which is then unknown)."""
    from torch.distributed import argparse_util
    from torch.distributed.run import get_args_parser

    flags: List[Flag] = []
    exact = True
    # argparse lists a parser's arguments only in this attribute
    for action in get_args_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue  # the positionals (script, its args) and -h are the caller's
        env = isinstance(action, (argparse_util.env, argparse_util.check_env))
        if env and ENV_PREFIX + action.dest.upper() in os.environ:
            exact = False
        converter = action.type
        type_name = next((n for n, t in _TYPES.items() if t is converter), "str")
        default = action.default
        if not isinstance(default, (str, int, float, bool, type(None))):
            default = None  # a list (torch's comma-separated filters): none, as declared
        flags.append(
            Flag(
                option_strings=tuple(action.option_strings),
                dest=action.dest,
                takes_value=action.nargs != 0,
                type=type_name,
                default=default,
                choices=tuple(str(c) for c in action.choices) if action.choices else None,
                help=action.help or "",
                env=env,
            )
        )
    return flags, exact


def _flag_from_json(d: Dict[str, Any]) -> Flag:
    choices = tuple(d["choices"]) if d["choices"] else None
    return Flag(**{**d, "option_strings": tuple(d["option_strings"]), "choices": choices})
