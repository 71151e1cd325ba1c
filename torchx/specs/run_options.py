"""Scheduler run options (``runopts``) and the ``-cfg k=v,...`` string form they are given in.

Parsing follows upstream, so the same ``-cfg`` string yields the same config. Unlike
upstream, :meth:`runopts.resolve` with a scheduler name rejects unknown keys, so a typo is
an error on every path that submits.
"""

from __future__ import annotations

import difflib
import json
import logging
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Type, Union, cast

from torchx.specs.errors import InvalidRunConfigException
from torchx.util.types import to_dict

logger = logging.getLogger(__name__)

CfgVal = Union[str, int, float, bool, List[str], Dict[str, str], None]

_LIST_TYPES: Tuple[Any, ...] = (List[str], list, list[str])
_DICT_TYPES: Tuple[Any, ...] = (Dict[str, str], dict, dict[str, str])


def get_type_name(tp: Any) -> str:
    """``int`` -> ``"int"``; typing constructs print as written (``typing.List[str]``)."""
    if getattr(tp, "__module__", None) != "typing" and hasattr(tp, "__name__"):
        return tp.__name__
    return str(tp)


def _split_items(value: str) -> List[str]:
    return [v for v in value.replace(";", ",").split(",") if v]


@dataclass
class runopt:
    """One scheduler run option: default, type, required flag and help."""

    default: CfgVal
    opt_type: Type[CfgVal]
    is_required: bool
    help: str

    @property
    def is_type_list_of_str(self) -> bool:
        return self.opt_type in _LIST_TYPES

    @property
    def is_type_dict_of_str(self) -> bool:
        return self.opt_type in _DICT_TYPES

    def cast_to_type(self, value: str) -> CfgVal:
        """Parse the string form (``-cfg`` / ``.torchxconfig``) of this option."""
        if self.opt_type is bool:
            low = value.strip().lower()
            if low not in ("true", "false"):
                # upstream turns anything but "true" into False (so "1" silently means False)
                raise ValueError(f"expected True or False, got {value!r}")
            return low == "true"
        if self.is_type_list_of_str:
            return _split_items(value)
        if self.is_type_dict_of_str:
            pairs = [item.split(":", 1) for item in _split_items(value)]
            for pair in pairs:
                if len(pair) != 2:
                    raise ValueError(f"expected key:value items, got {pair[0]!r}")
            return dict(pairs)
        if self.opt_type is int:
            return int(value)
        if self.opt_type is float:
            return float(value)
        return value


class runopts:
    """The set of run options a scheduler accepts (``torchx runopts``)."""

    def __init__(self) -> None:
        self._opts: Dict[str, runopt] = {}

    def __iter__(self) -> Iterator[Tuple[str, runopt]]:
        return iter(self._opts.items())

    def __len__(self) -> int:
        return len(self._opts)

    def __contains__(self, key: str) -> bool:
        return key in self._opts

    @staticmethod
    def is_type(obj: CfgVal, tp: Type[CfgVal]) -> bool:
        """Whether ``obj`` matches ``tp`` (bool is not an int here; lists/dicts of str)."""
        if tp in _LIST_TYPES:
            return isinstance(obj, list) and all(isinstance(x, str) for x in obj)
        if tp in _DICT_TYPES:
            return isinstance(obj, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in obj.items()
            )
        if tp is float:
            return isinstance(obj, (int, float)) and not isinstance(obj, bool)
        if tp is int:
            return isinstance(obj, int) and not isinstance(obj, bool)
        try:
            return isinstance(obj, cast(type, tp))
        except TypeError:
            return False

    def add(
        self,
        cfg_key: str,
        type_: Type[CfgVal],
        help: str,
        default: CfgVal = None,
        required: bool = False,
    ) -> None:
        if type_ in _DICT_TYPES and default == []:
            default = {}  # upstream accepted an empty list as an empty dict's default
        if required and default is not None:
            raise ValueError(f"required option {cfg_key!r} cannot have a default ({default!r})")
        if default is not None and not runopts.is_type(default, type_):
            raise TypeError(
                f"option {cfg_key!r}: default {default!r} is not of type {get_type_name(type_)}"
            )
        self._opts[cfg_key] = runopt(default, type_, required, help)

    def get(self, name: str) -> Optional[runopt]:
        return self._opts.get(name)

    def update(self, other: runopts) -> None:
        self._opts.update(other._opts)

    def resolve(self, cfg: Mapping[str, CfgVal], scheduler: str = "") -> Dict[str, CfgVal]:
        """``cfg`` with defaults filled in; raises on a missing required key or a wrong type,
        and, given the ``scheduler``'s name, on an unknown key (else it passes, as upstream)."""
        if scheduler:
            self.check_known(cfg, scheduler)
        resolved: Dict[str, CfgVal] = dict(cfg)
        for key, opt in self._opts.items():
            val = resolved.get(key)
            if val is None:
                if opt.is_required:
                    raise InvalidRunConfigException(
                        f"Required run option {key!r} is missing; pass it with -cfg {key}=VALUE"
                        " or set it in .torchxconfig",
                        key,
                        cfg,
                    )
                resolved[key] = opt.default
            elif not runopts.is_type(val, opt.opt_type):
                if opt.opt_type is float and runopts.is_type(val, int):
                    resolved[key] = float(cast(int, val))
                    continue
                raise InvalidRunConfigException(
                    f"Run option {key!r} must be of type {get_type_name(opt.opt_type)},"
                    f" got {val!r} ({type(val).__name__})",
                    key,
                    cfg,
                )
        return resolved

    def check_known(self, cfg: Mapping[str, CfgVal], scheduler: str = "") -> None:
        """Raise :class:`InvalidRunConfigException` naming the first key of ``cfg`` that
        is not one of these options (a typo would otherwise be dropped without a word)."""
        unknown = [k for k in cfg if k not in self._opts]
        if unknown:
            raise InvalidRunConfigException(
                self._unknown_message(unknown[0], scheduler), unknown[0], dict(cfg)
            )

    def _unknown_message(self, key: str, scheduler: str = "") -> str:
        known = ", ".join(sorted(self._opts)) or "(none)"
        close = difflib.get_close_matches(key, list(self._opts), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        owner = f" of the {scheduler} scheduler" if scheduler else ""
        return f"Unknown run option {key!r}{hint}; valid options{owner} are: {known}"

    def _unknown(self, key: str, given: str, strict: bool) -> None:
        if strict:
            raise InvalidRunConfigException(self._unknown_message(key), key, given)
        known = ", ".join(sorted(self._opts)) or "(none)"
        logger.warning("ignoring unknown run option %r (valid options: %s)", key, known)

    def cfg_from_str(self, cfg_str: str, strict: bool = False) -> Dict[str, CfgVal]:
        """Parse ``"k=v,l=a;b,d=k1:v1;k2:v2"`` (``to_dict``'s rules) into typed values, without
        defaults; unknown keys are dropped with a warning, or raise when ``strict``."""
        try:
            pairs = to_dict(cfg_str)
        except ValueError:
            raise InvalidRunConfigException(
                f"Malformed run config {cfg_str!r}; expected KEY=VALUE[,KEY=VALUE...]",
                cfg_str,
                cfg_str,
            ) from None
        cfg: Dict[str, CfgVal] = {}
        for key, raw in pairs.items():
            opt = self._opts.get(key)
            if opt is None:
                self._unknown(key, cfg_str, strict)
                continue
            try:
                cfg[key] = opt.cast_to_type(raw)
            except ValueError as e:
                raise InvalidRunConfigException(
                    f"Run option {key!r} must be of type {get_type_name(opt.opt_type)}: {e}",
                    key,
                    cfg_str,
                ) from None
        return cfg

    def cfg_from_json_repr(self, json_repr: str, strict: bool = False) -> Dict[str, CfgVal]:
        """Parse a JSON object of options (unknown keys as in :meth:`cfg_from_str`)."""
        data = json.loads(json_repr)
        cfg: Dict[str, CfgVal] = {}
        for key, val in data.items():
            opt = self._opts.get(key)
            if opt is None:
                self._unknown(key, json_repr, strict)
                continue
            if opt.is_type_list_of_str and isinstance(val, list):
                val = [str(v) for v in val]
            elif opt.is_type_dict_of_str and isinstance(val, dict):
                val = {str(k): str(v) for k, v in val.items()}
            cfg[key] = val
        return cfg

    def __repr__(self) -> str:
        required = [(k, o) for k, o in self._opts.items() if o.is_required]
        optional = [(k, o) for k, o in self._opts.items() if not o.is_required]
        usage = [f"{k}={k.upper()}" for k, _ in required]
        usage += [f"[{k}={k.upper()}]" for k, _ in optional]
        out = "    usage:\n        " + ",".join(usage)
        for section, opts in (("required", required), ("optional", optional)):
            if not opts:
                continue
            out += f"\n\n    {section} arguments:"
            for k, o in opts:
                default = "" if o.is_required else f", {o.default}"
                out += f"\n        {k}={k.upper()} ({get_type_name(o.opt_type)}{default})"
                out += f"\n            {o.help}"
        return out
