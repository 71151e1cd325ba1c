"""Entry-point plugin lookup: lazy, once per process, adding to (never hiding) builtins."""

from __future__ import annotations

import importlib
import logging
from importlib import metadata
from importlib.metadata import EntryPoint
from typing import Any, Callable, Dict, Tuple

logger = logging.getLogger(__name__)

# group -> (the scan function used, its entry points by name). Keyed on the function too,
# so code that swaps ``metadata.entry_points`` (upstream's tests patch
# ``torchx.util.entrypoints.metadata.entry_points``) sees its own entries, not a stale scan.
_scanned: Dict[str, Tuple[Any, Dict[str, EntryPoint]]] = {}


def _group(group: str) -> Dict[str, EntryPoint]:
    scan = metadata.entry_points
    hit = _scanned.get(group)
    if hit is None or hit[0] is not scan:
        eps = scan(group=group)
        if hasattr(eps, "select"):  # a stand-in may return every group
            eps = eps.select(group=group)
        hit = _scanned[group] = (scan, {ep.name: ep for ep in eps})
    return hit[1]


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
