"""Entry-point plugin lookup: lazy, once per process, adding to (never hiding) builtins."""

from __future__ import annotations

import functools
import importlib
import logging
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable, Dict

logger = logging.getLogger(__name__)


@functools.cache
def _group(group: str) -> Dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=group)}


def entry_point_names(group: str) -> list[str]:
    """Names registered in ``group`` (scanned once per process)."""
    return sorted(_group(group))


def load_group(group: str) -> Dict[str, Callable[[], Any]]:
    """``{name: loader}`` for every entry point in ``group``; each loader imports on call."""
    return {name: ep.load for name, ep in _group(group).items()}


def load(group: str, name: str, default: Any = None) -> Any:
    """Load one entry point, or return ``default`` when it is not registered."""
    ep = _group(group).get(name)
    return ep.load() if ep is not None else default


def load_object(path: str) -> Any:
    """Import ``pkg.module:attr`` (or a plain module path)."""
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj
