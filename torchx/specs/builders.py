"""Turn a component function plus command-line arguments into an ``AppDef``.

As upstream, except that a bad argument raises :class:`ComponentArgumentError` instead
of exiting the process, and values are decoded by their type hints (``Optional[int]`` is
an int, ``--flag maybe`` is an error).
"""

from __future__ import annotations

import argparse
import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, NoReturn, Optional, Sequence

# upstream's names in specs.builders
from torchx.specs.api import (  # noqa: F401
    AppDef,
    BindMount,
    DeviceMount,
    MountType,
    TorchXError,
    VolumeMount,
    make_app_handle,
    parse_mounts,
)
from torchx.specs.file_linter import TorchXArgumentHelpFormatter, get_fn_docstring
from torchx.util.types import (  # noqa: F401
    decode,
    decode_optional,
    get_argparse_param_type,
    is_bool,
)


class ComponentArgumentError(TorchXError):
    """Bad arguments for a component (unknown flag, missing required, wrong type)."""


class ComponentHelpRequest(Exception):
    """``--help`` was given: carries the help text for the caller to print."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class _ComponentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ComponentArgumentError(f"{self.prog.strip()}: {message}")


class _HelpAction(argparse.Action):
    """``--help``: print and exit (upstream), or raise ``ComponentHelpRequest`` for the caller."""

    def __init__(self, option_strings: Sequence[str], dest: str, raise_help: bool) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="show this help message and exit",
        )
        self._raise_help = raise_help

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        if self._raise_help:
            raise ComponentHelpRequest(parser.format_help())
        parser.print_help()
        parser.exit()


class _RemainderAction(argparse.Action):
    """``*args``: the rest of the command line, or the (space-separated) default if none."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: Optional[str] = None,
    ) -> None:
        default = self.default if isinstance(self.default, str) else ""
        setattr(namespace, self.dest, list(values) if values else default.split())


def _argparse_type(param: inspect.Parameter) -> Callable[[str], object]:
    """Upstream's argparse type (int/float/str as annotated, else str), erring in our words."""
    tp = get_argparse_param_type(param)
    if tp is str:
        return tp

    def convert(value: str) -> object:
        try:
            return tp(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {tp.__name__}, got {value!r}") from None

    convert.__name__ = tp.__name__  # the metavar in --help, as upstream shows it
    return convert


def _type_hints(fn: Callable[..., Any]) -> Dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except (NameError, AttributeError, TypeError, SyntaxError):  # an unresolvable annotation
        return {k: p.annotation for k, p in inspect.signature(fn).parameters.items()}


def _build_parser(
    fn: Callable[..., Any],
    cmpnt_defaults: Optional[Mapping[str, Any]],
    config: Optional[Mapping[str, Any]],
    with_docs: bool,
    raise_help: bool,
) -> argparse.ArgumentParser:
    params = inspect.signature(fn).parameters
    hints = _type_hints(fn)  # string annotations (from __future__ import annotations) resolved
    if with_docs:
        desc, args_desc = get_fn_docstring(fn)
    else:  # docstrings only matter for --help: skip parsing them on the launch path
        desc, args_desc = "", {name: " " for name in params}
    parser = _ComponentParser(
        prog=f"torchx run <run args...> {fn.__name__} ",
        description=desc,
        formatter_class=TorchXArgumentHelpFormatter,
        add_help=False,  # keeps -h free for a component parameter named h
        allow_abbrev=False,
    )
    parser.add_argument("--help", action=_HelpAction, raise_help=raise_help)
    for name, param in params.items():
        if param.kind == param.VAR_KEYWORD:
            continue  # rejected when materialized
        kwargs: Dict[str, Any] = {"help": args_desc.get(name, " ")}
        kwargs["type"] = _argparse_type(param.replace(annotation=hints.get(name)))
        if param.default is not inspect.Parameter.empty:
            default = param.default
            kwargs["default"] = str(default) if is_bool(type(default)) else default
        if cmpnt_defaults and name in cmpnt_defaults:
            kwargs["default"] = cmpnt_defaults[name]
        if param.kind == param.VAR_POSITIONAL:
            parser.add_argument(name, nargs=argparse.REMAINDER, action=_RemainderAction, **kwargs)
            continue
        flags = ([f"-{name}"] if len(name) == 1 else []) + [f"--{name}"]
        if "default" not in kwargs and not (config and name in config):
            kwargs["required"] = True
        parser.add_argument(*flags, **kwargs)
    return parser


def _create_args_parser(
    cmpnt_fn: Callable[..., Any],
    cmpnt_defaults: Optional[Mapping[str, Any]] = None,
    config: Optional[Mapping[str, Any]] = None,
) -> argparse.ArgumentParser:
    """The component's argparse parser, as upstream builds it (``--help`` prints and exits)."""
    return _build_parser(cmpnt_fn, cmpnt_defaults, config, with_docs=True, raise_help=False)


def component_help(
    fn: Callable[..., Any], cmpnt_defaults: Optional[Mapping[str, str]] = None
) -> str:
    """The ``--help`` text of a component."""
    return _create_args_parser(fn, cmpnt_defaults).format_help()


def parse_args(
    cmpnt_fn: Callable[..., Any],
    cmpnt_args: List[str],
    cmpnt_defaults: Optional[Mapping[str, Any]] = None,
    config: Optional[Mapping[str, Any]] = None,
    *,
    _raise_help: bool = False,
) -> argparse.Namespace:
    """The parsed (not yet decoded) arguments, ``config`` values merged over them.
    ``--help`` prints and exits, as upstream; with ``_raise_help`` (torchx's own callers)
    it raises :class:`ComponentHelpRequest` instead."""
    wants_help = "--help" in cmpnt_args
    parser = _build_parser(cmpnt_fn, cmpnt_defaults, config, wants_help, _raise_help)
    parsed = parser.parse_args(cmpnt_args)
    for key, value in (config or {}).items():
        if key in parsed:
            setattr(parsed, key, value)
    return parsed


@dataclass
class ComponentArgs:
    positional_args: Dict[str, Any]
    var_args: List[str]
    kwargs: Dict[str, Any]


def component_args_from_str(
    fn: Callable[..., Any],
    cmpnt_args: List[str],
    cmpnt_defaults: Optional[Mapping[str, Any]] = None,
    config: Optional[Mapping[str, Any]] = None,
) -> ComponentArgs:
    """Parse and decode ``cmpnt_args`` (CLI strings) and ``config`` (typed values) for ``fn``."""
    params = inspect.signature(fn).parameters
    for name, param in params.items():
        if param.kind == param.VAR_KEYWORD:
            raise ComponentArgumentError(
                f"{fn.__name__}: **{name}: **kwargs are not supported for component definitions"
            )
    unknown = set(config or {}) - set(params)
    if unknown:
        raise ComponentArgumentError(
            f"{fn.__name__}: unknown argument(s) {', '.join(sorted(unknown))}"
        )
    parsed = parse_args(fn, list(cmpnt_args), cmpnt_defaults, config, _raise_help=True)
    hints = _type_hints(fn)
    out = ComponentArgs({}, [], {})
    for name, param in params.items():
        value = getattr(parsed, name, None)
        if param.kind == param.VAR_POSITIONAL:
            var_args = [str(a) for a in (value or [])]
            out.var_args = var_args[1:] if var_args[:1] == ["--"] else var_args
            continue
        try:
            value = decode(value, hints.get(name, str))
        except ValueError as e:
            raise ComponentArgumentError(f"{fn.__name__}: argument --{name}: {e}") from None
        if param.kind == param.KEYWORD_ONLY:
            out.kwargs[name] = value
        else:
            out.positional_args[name] = value
    return out


def materialize_appdef(
    cmpnt_fn: Callable[..., Any],
    cmpnt_args: List[str],
    cmpnt_defaults: Optional[Mapping[str, Any]] = None,
    config: Optional[Mapping[str, Any]] = None,
) -> AppDef:
    """Call the component with parsed arguments; ``cmpnt_defaults`` (strings, as in
    ``.torchxconfig``) override its defaults, ``config`` (typed values) override both."""
    args = component_args_from_str(cmpnt_fn, cmpnt_args, cmpnt_defaults, config)
    appdef = cmpnt_fn(*args.positional_args.values(), *args.var_args, **args.kwargs)
    if not isinstance(appdef, AppDef):
        raise TypeError(
            f"component {cmpnt_fn.__name__} returned {type(appdef).__name__}, expected AppDef"
        )
    return appdef
