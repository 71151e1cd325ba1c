"""Lazy imports of optional dependencies with a one-line error naming the extra."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message says which extra to install."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(
            f"'{module}' is not installed; install it with: pip install 'torchx[{extra}]'"
        )
        self.module = module
        self.extra = extra


def import_optional(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        if e.name and e.name.split(".")[0] == top:
            raise MissingExtraError(module, extra) from e
        raise


def load_module(path: str) -> object:
    """``pkg.module`` or ``pkg.module:attr`` imported; None when it cannot be loaded
    (upstream's helper: it swallows the error, so prefer ``import_optional``)."""
    module_path, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_path)
        return getattr(module, attr) if attr else module
    except Exception:  # upstream's contract: whatever fails to load is None
        return None
