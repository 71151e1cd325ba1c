"""Submit and manage apps on any scheduler: ``get_runner()``.

``Runner`` and ``get_runner`` load ``torchx.runner.api`` on first use: a package that
imports its own submodules forms an import cycle, and two threads that first-import such a
cycle at once (a trigger's status and log threads, a Prefect task pool) can see a partially
initialized module.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchx.runner.api import Runner, get_runner

__all__ = ["Runner", "get_runner"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from torchx.runner import api

        return getattr(api, name)
    raise AttributeError(f"module 'torchx.runner' has no attribute {name!r}")
