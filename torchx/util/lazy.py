"""Package attributes loaded on first access, so importing a package stays cheap.

``__getattr__ = lazy_getattr(__name__, {"Name": "pkg.module"})`` in a package's
``__init__`` makes ``from pkg import Name`` import ``pkg.module`` only then (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_getattr(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving ``names`` (``{attribute: module}``) lazily."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
