"""``__getattr__ = lazy_getattr(__name__, {"Name": "pkg.module"})``: a package attribute
imported on first access (PEP 562), so importing the package stays cheap."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping


def lazy_getattr(
    package: str, names: Mapping[str, str], submodules: bool = False
) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving ``names`` (``{attribute: module}``) lazily, each
    imported once (then a plain attribute); ``submodules``: also ``package.<submodule>``
    not imported yet (``torchx.trackers.api`` after ``import torchx.trackers``)."""

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        if submodules:
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
