"""Turn a component function plus command-line arguments into an ``AppDef``.

Each parameter becomes ``--name`` (one-letter names also ``-x``); ``*args`` takes
the rest of the command line. Help text comes from the Google-style docstring.
"""

from __future__ import annotations

import argparse
import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

from torchx.specs.api import AppDef, TorchXError, make_app_handle
from torchx.util.types import decode, type_name, type_problem

__all__ = [
    "ComponentArgumentError",
    "ComponentArgs",
    "component_help",
    "component_args_from_str",
    "make_app_handle",
    "materialize_appdef",
    "validate_component_fn",
]


class ComponentArgumentError(TorchXError):
    """Bad arguments for a component (unknown flag, missing required, wrong type)."""


class _ComponentHelp(Exception):
    """``--help`` was given: carries the help text for the caller to print."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # type: ignore[override]
        raise ComponentArgumentError(f"{self.prog.strip()}: {message}")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    pass


def _doc(fn: Callable[..., Any]) -> tuple[str, Dict[str, str]]:
    import docstring_parser

    doc = inspect.getdoc(fn)
    if not doc:
        return (
            f"{fn.__name__}"
            " (TIP: improve this help string by adding a docstring to your component)",
            {},
        )
    parsed = docstring_parser.parse(doc)
    desc = "\n\n".join(p for p in (parsed.short_description, parsed.long_description) if p)
    return desc, {p.arg_name.lstrip("*"): (p.description or " ") for p in parsed.params}


def validate_component_fn(fn: Callable[..., Any], where: str = "") -> None:
    """Check the component rules; one-line ``ComponentArgumentError`` naming the parameter."""
    label = where or getattr(fn, "__qualname__", repr(fn))
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:
        raise ComponentArgumentError(f"{label}: cannot resolve type annotations: {e}") from None
    sig = inspect.signature(fn)
    for name, param in sig.parameters.items():
        if param.kind == param.VAR_KEYWORD:
            raise ComponentArgumentError(f"{label}: **{name} is not supported in components")
        if name not in hints:
            raise ComponentArgumentError(f"{label}: parameter {name!r} has no type annotation")
        if param.kind == param.VAR_POSITIONAL:
            if hints[name] is not str:
                raise ComponentArgumentError(f"{label}: *{name} must be annotated as str")
            continue
        problem = type_problem(hints[name])
        if problem:
            raise ComponentArgumentError(f"{label}: parameter {name!r} has {problem}")
    ret = hints.get("return")
    if ret is not AppDef:
        raise ComponentArgumentError(f"{label}: must be annotated to return AppDef")


def _default_str(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _create_args_parser(
    fn: Callable[..., Any],
    cmpnt_defaults: Optional[Mapping[str, str]] = None,
    config: Optional[Mapping[str, Any]] = None,
    with_help: bool = True,
) -> argparse.ArgumentParser:
    # docstring parsing is only needed to show help: skip it on the hot path
    desc, arg_help = _doc(fn) if with_help else ("", {})
    hints = typing.get_type_hints(fn)
    parser = _RaisingParser(
        prog=f"torchx run <run args...> {fn.__name__} ",
        description=desc,
        add_help=False,
        formatter_class=_HelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--help", action="store_true", help="show this help message and exit")
    defaults = dict(cmpnt_defaults or {})
    for name, param in inspect.signature(fn).parameters.items():
        help_text = arg_help.get(name, " ")
        if param.kind == param.VAR_POSITIONAL:
            parser.add_argument(name, nargs=argparse.REMAINDER, help=help_text)
            continue
        flags = [f"--{name}"] + ([f"-{name}"] if len(name) == 1 else [])
        default = defaults.get(name, param.default)
        required = default is inspect.Parameter.empty and not (config and name in config)
        shown_default = None if default is inspect.Parameter.empty else _default_str(default)
        suffix = " (required)" if required else f" (default: {shown_default})"
        parser.add_argument(
            *flags,
            dest=name,
            type=str,
            required=required,
            default=None,
            metavar=type_name(hints.get(name, str)),
            help=help_text.strip() + suffix,
        )
    return parser


def component_help(
    fn: Callable[..., Any], cmpnt_defaults: Optional[Mapping[str, str]] = None
) -> str:
    """The ``--help`` text of a component."""
    return _create_args_parser(fn, cmpnt_defaults).format_help()


@dataclass
class ComponentArgs:
    positional_args: Dict[str, Any]
    var_args: List[str]
    kwargs: Dict[str, Any]


def component_args_from_str(
    fn: Callable[..., Any],
    cmpnt_args: List[str],
    cmpnt_defaults: Optional[Mapping[str, str]] = None,
    config: Optional[Mapping[str, Any]] = None,
) -> ComponentArgs:
    """Parse and decode ``cmpnt_args`` (CLI strings) and ``config`` (typed values) for ``fn``."""
    validate_component_fn(fn)
    wants_help = "--help" in cmpnt_args
    parser = _create_args_parser(fn, cmpnt_defaults, config, with_help=wants_help)
    parsed = parser.parse_args(cmpnt_args)
    if parsed.help:
        raise _ComponentHelp(parser.format_help())
    hints = typing.get_type_hints(fn)
    defaults = dict(cmpnt_defaults or {})
    config = dict(config or {})
    positional: Dict[str, Any] = {}
    kwargs: Dict[str, Any] = {}
    var_args: List[str] = []
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind == param.VAR_POSITIONAL:
            var_args = list(getattr(parsed, name) or [])
            if var_args and var_args[0] == "--":
                var_args = var_args[1:]
            if not var_args and name in config:
                var_args = [str(a) for a in config[name]]
            continue
        raw = getattr(parsed, name)
        if raw is None and name in config:
            raw = config[name]
        elif raw is None and name in defaults:
            raw = defaults[name]
        if raw is None:
            value = None if param.default is inspect.Parameter.empty else param.default
        else:
            try:
                value = decode(raw, hints[name])
            except ValueError as e:
                raise ComponentArgumentError(f"{fn.__name__}: argument --{name}: {e}") from None
        if param.kind == param.KEYWORD_ONLY:
            kwargs[name] = value
        else:
            positional[name] = value
    unknown = set(config) - set(inspect.signature(fn).parameters)
    if unknown:
        raise ComponentArgumentError(
            f"{fn.__name__}: unknown argument(s) {', '.join(sorted(unknown))}"
        )
    return ComponentArgs(positional, var_args, kwargs)


def materialize_appdef(
    cmpnt_fn: Callable[..., Any],
    cmpnt_args: List[str],
    cmpnt_defaults: Optional[Mapping[str, str]] = None,
    config: Optional[Mapping[str, Any]] = None,
) -> AppDef:
    """Call the component with parsed arguments; raises if it does not return an AppDef."""
    args = component_args_from_str(cmpnt_fn, cmpnt_args, cmpnt_defaults, config)
    appdef = cmpnt_fn(*args.positional_args.values(), *args.var_args, **args.kwargs)
    if not isinstance(appdef, AppDef):
        raise TypeError(
            f"component {cmpnt_fn.__name__} returned {type(appdef).__name__}, expected AppDef"
        )
    return appdef


def is_help_request(e: BaseException) -> Optional[str]:
    """The help text if ``e`` is a ``--help`` request, else None (for the CLI)."""
    return e.text if isinstance(e, _ComponentHelp) else None
