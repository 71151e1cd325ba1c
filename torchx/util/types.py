"""Decoding command-line strings into component argument types (upstream's names).

Where upstream returned a wrong value (``"1"`` as a bool is False there, ``Optional[int]``
stays a string), these decode correctly or raise a one-line ``ValueError``.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

PRIMITIVES: Tuple[type, ...] = (str, int, float, bool)

# a pair delimiter is the last "," or ";" before the next "key="
_PAIR_DELIM = re.compile(r"[,;](?=[^,;=]+=)")


def to_list(arg: str) -> List[str]:
    """``"a, b,c"`` -> ``["a", "b", "c"]``; an empty string is an empty list."""
    if not arg.strip():
        return []
    return [x.strip() for x in arg.split(",")]


def to_dict(arg: str) -> Dict[str, str]:
    """``"k1=v1,k2=v2"`` (or ``;``) to a dict of value literals; ``''`` and ``""`` are empty.

    The last delimiter before the next ``key=`` separates the pairs: ``FOO=v1,v2,BAR=v3`` is
    ``{"FOO": "v1,v2", "BAR": "v3"}``.
    """
    if not arg or not arg.strip():
        return {}
    out: Dict[str, str] = {}
    for pair in _PAIR_DELIM.split(arg):
        key, sep, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise ValueError(f"`{arg}` is not of the form KEY=VALUE[,KEY=VALUE...]")
        out[key] = "" if value in ("''", '""') else value
    return out


def unwrap_optional(tp: Any) -> Tuple[Any, bool]:
    """``Optional[T]``/``T | None``/``None | T`` -> ``(T, True)``; else ``(tp, False)``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def decode_optional(param_type: Any) -> Any:
    """``T`` for ``Optional[T]`` (also ``T | None`` and ``None | T``), else ``param_type``."""
    return unwrap_optional(param_type)[0]


def is_bool(param_type: Any) -> bool:
    return param_type is bool


def is_primitive(param_type: Any) -> bool:
    """Whether ``param_type`` is ``int``, ``str`` or ``float`` (not bool, as upstream)."""
    return param_type in (int, str, float)


def get_argparse_param_type(parameter: inspect.Parameter) -> Callable[[str], object]:
    """The argparse ``type=`` for a component parameter: int/str/float as annotated, else str."""
    return parameter.annotation if is_primitive(parameter.annotation) else str


_T = TypeVar("_T")


def none_throws(optional: Optional[_T], message: str = "Unexpected `None`") -> _T:
    if optional is None:
        raise AssertionError(message)
    return optional


def type_name(tp: Any) -> str:
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _decode_primitive(value: str, tp: Any) -> Any:
    if tp is bool:
        low = value.strip().lower()
        if low not in ("true", "1", "yes", "false", "0", "no"):
            raise ValueError(f"expected True or False, got {value!r}")
        return low in ("true", "1", "yes")
    if tp is str or tp is object:
        return value
    try:
        return tp(value)
    except (TypeError, ValueError):
        raise ValueError(f"expected {type_name(tp)}, got {value!r}") from None


def decode_from_string(encoded_value: str, annotation: Any) -> Any:
    """Decode ``"a,b"`` into ``List[T]`` or ``"k=v,k2=v2"`` into ``Dict[K, V]`` (``""``: None)."""
    if not encoded_value:
        return None
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (dict, Dict) and len(args) == 2:
        return {
            _decode_primitive(k, args[0]): _decode_primitive(v, args[1])
            for k, v in to_dict(encoded_value).items()
        }
    if origin in (list, List) and len(args) == 1:
        if args[0] not in PRIMITIVES:
            raise ValueError(
                f"List types support only primitives (int, str, float, bool), got {annotation}"
            )
        return [_decode_primitive(v, args[0]) for v in to_list(encoded_value)]
    raise ValueError(
        f"a {type_name(annotation)} cannot be given on the command line; the component should"
        " take str, int, float, bool, or an Optional, List or Dict of those"
    )


def decode(encoded_value: Any, annotation: Any) -> Any:
    """Turn ``encoded_value`` (a CLI string, or already typed from a dict) into ``annotation``."""
    inner, optional = unwrap_optional(annotation)
    if encoded_value is None:
        return None
    if not isinstance(encoded_value, str):
        return encoded_value
    if optional and encoded_value == "None":
        return None
    if inner in PRIMITIVES or inner is object:
        return _decode_primitive(encoded_value, inner)
    return decode_from_string(encoded_value, inner)
