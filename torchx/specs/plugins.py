"""``torchx.specs.load_group``: upstream's entry-point group loader, with its calling
convention (a deferred loader that returns a module or calls a function), over
:mod:`torchx.util.entrypoints`."""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Dict, Optional


def _deferred(loader: Callable[[], Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        obj = loader()
        return obj if isinstance(obj, ModuleType) else obj(*args, **kwargs)

    return run


def load_group(group: str, default: Optional[Dict[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """``{name: deferred_load_fn}`` for the entry points of ``group``; ``default`` if it has none.

    ``load_group("torchx.schedulers")["slurm"]("my_session")`` calls the entry point.
    """
    from torchx.util import entrypoints

    loaders = entrypoints.load_group(group)
    if not loaders:
        return default
    return {name: _deferred(loader) for name, loader in loaders.items()}
