"""Decoding command-line strings into component argument types, and the type rules."""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Dict, List, Optional, Tuple

PRIMITIVES: Tuple[type, ...] = (str, int, float, bool)


def to_dict(arg: str) -> Dict[str, str]:
    """``"k1=v1,k2=v2"`` (or ``;``) to a dict; a value may contain delimiters: ``a=1,2,b=3``."""
    arg = arg.strip()
    if not arg:
        return {}
    out: Dict[str, str] = {}
    for pair in re.split(r"[,;](?=\s*[^,;=\s]+\s*=)", arg):
        if "=" not in pair:
            raise ValueError(f"expected KEY=VALUE pairs, got {pair!r}")
        k, v = pair.split("=", 1)
        out[k.strip()] = v.strip().strip("'\"")
    return out


def to_list(arg: str) -> List[str]:
    return [x.strip() for x in arg.split(",") if x.strip()]


def unwrap_optional(tp: Any) -> Tuple[Any, bool]:
    """``Optional[T]``/``T | None``/``None | T`` -> ``(T, True)``.

    Anything else -> ``(tp, False)``.
    """
    origin = typing.get_origin(tp)
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def type_problem(tp: Any) -> Optional[str]:
    """Why ``tp`` is not an allowed component argument type, or None if it is."""
    inner, _ = unwrap_optional(tp)
    if inner in PRIMITIVES:
        return None
    origin = typing.get_origin(inner)
    args = typing.get_args(inner)
    if origin in (list, List) and len(args) == 1 and args[0] in PRIMITIVES:
        return None
    if origin in (dict, Dict) and len(args) == 2 and all(a in PRIMITIVES for a in args):
        return None
    return (
        f"unsupported type {type_name(tp)!r}; use str, int, float, bool, Optional[T],"
        " list[T] or dict[K, V] of those"
    )


def type_name(tp: Any) -> str:
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "")


def decode_bool(value: str) -> bool:
    low = value.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise ValueError(f"expected True or False, got {value!r}")


def _decode_primitive(value: str, tp: type) -> Any:
    if tp is bool:
        return decode_bool(value)
    if tp is str:
        return value
    try:
        return tp(value)
    except ValueError:
        raise ValueError(f"expected {tp.__name__}, got {value!r}") from None


def decode(value: Any, tp: Any) -> Any:
    """Turn ``value`` (a CLI string, or already-typed from a dict) into ``tp``."""
    inner, optional = unwrap_optional(tp)
    if value is None:
        return None
    if not isinstance(value, str):
        return value
    if optional and value == "None":
        return None
    if inner in PRIMITIVES:
        return _decode_primitive(value, inner)
    origin = typing.get_origin(inner)
    args = typing.get_args(inner)
    if origin in (list, List):
        return [_decode_primitive(v, args[0]) for v in to_list(value)]
    if origin in (dict, Dict):
        return {
            _decode_primitive(k, args[0]): _decode_primitive(v, args[1])
            for k, v in to_dict(value).items()
        }
    return value
