"""Scheduler registry: builtins plus the ``torchx.schedulers`` entry points, all imported lazily.

Stdlib only at import: the ``local_cwd`` supervisor (``torchx.schedulers.local.supervisor``)
is imported through this package by a bare ``python -S -E``; ``Scheduler`` (upstream's
name here) is loaded when first asked for.
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Mapping, Optional, Protocol

if TYPE_CHECKING:
    from torchx.schedulers.api import Scheduler

DEFAULT_SCHEDULER_MODULES: Dict[str, str] = {
    "local_docker": "torchx.schedulers.docker_scheduler",
    "local_cwd": "torchx.schedulers.local.scheduler",
    "slurm": "torchx.schedulers.slurm.scheduler",
    "kubernetes": "torchx.schedulers.kubernetes.scheduler",
    "aws_batch": "torchx.schedulers.aws_batch_scheduler",
    "ray": "torchx.schedulers.ray_scheduler",
}


class SchedulerFactory(Protocol):
    def __call__(self, session_name: str, **kwargs: Any) -> Scheduler: ...


# Python lets two threads that first-import modules of one import cycle at the same time
# see a partially initialized module (ImportError). Threads do load schedulers (a trigger's
# status and log threads), so scheduler modules are first imported one at a time.
_IMPORT_LOCK = threading.RLock()


def _deferred(module: str) -> SchedulerFactory:
    def factory(session_name: str, **kwargs: Any) -> Scheduler:
        with _IMPORT_LOCK:
            loaded = importlib.import_module(module)
        return loaded.create_scheduler(session_name, **kwargs)

    return factory


def get_scheduler_factories(
    group: str = "torchx.schedulers", skip_defaults: bool = False
) -> Dict[str, SchedulerFactory]:
    """``{name: create_scheduler}``: plugins add to the builtins, never hiding one."""
    from torchx.util.entrypoints import load_group

    factories: Dict[str, SchedulerFactory] = {
        name: _plugin(loader) for name, loader in load_group(group).items()
    }
    if not skip_defaults:
        factories.update({name: _deferred(mod) for name, mod in DEFAULT_SCHEDULER_MODULES.items()})
    return factories


def _plugin(loader: Callable[[], Any]) -> SchedulerFactory:
    def factory(session_name: str, **kwargs: Any) -> Scheduler:
        return loader()(session_name, **kwargs)

    return factory


class SchedulerFactories(Mapping[str, SchedulerFactory]):
    """Builtins plus plugins, scanning entry points only when a non-builtin name is asked for
    (or the whole set is listed): looking up ``local_cwd`` costs no metadata scan."""

    def __init__(self, group: str = "torchx.schedulers") -> None:
        self._group = group
        self._all: Optional[Dict[str, SchedulerFactory]] = None

    def _full(self) -> Dict[str, SchedulerFactory]:
        if self._all is None:
            self._all = get_scheduler_factories(self._group)
        return self._all

    def __getitem__(self, name: str) -> SchedulerFactory:
        if name in DEFAULT_SCHEDULER_MODULES:  # builtins are never hidden by plugins
            return _deferred(DEFAULT_SCHEDULER_MODULES[name])
        return self._full()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._full())

    def __len__(self) -> int:
        return len(self._full())


def get_default_scheduler_name() -> str:
    """``local_cwd``: the scheduler that works on any machine (upstream's default needs Docker)."""
    return "local_cwd"


def __getattr__(name: str) -> Any:
    if name == "Scheduler":
        from torchx.schedulers.api import Scheduler

        return Scheduler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
