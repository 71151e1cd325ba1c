"""Scheduler registry: builtins plus the ``torchx.schedulers`` entry points, all imported lazily."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, Protocol

from torchx.schedulers.api import Scheduler

DEFAULT_SCHEDULER_MODULES: Dict[str, str] = {
    "local_cwd": "torchx.schedulers.local_scheduler",
    "slurm": "torchx.schedulers.slurm_scheduler",
    "kubernetes": "torchx.schedulers.kubernetes_scheduler",
    "aws_batch": "torchx.schedulers.aws_batch_scheduler",
    "ray": "torchx.schedulers.ray_scheduler",
}


class SchedulerFactory(Protocol):
    def __call__(self, session_name: str, **kwargs: Any) -> Scheduler: ...


def _deferred(module: str) -> SchedulerFactory:
    def factory(session_name: str, **kwargs: Any) -> Scheduler:
        return importlib.import_module(module).create_scheduler(session_name, **kwargs)

    return factory


def get_scheduler_factories(
    group: str = "torchx.schedulers", skip_defaults: bool = False
) -> Dict[str, SchedulerFactory]:
    """``{name: create_scheduler}``; plugins add to the builtins (a plugin of the same name wins)."""
    from torchx.util.entrypoints import load_group

    factories: Dict[str, SchedulerFactory] = {}
    if not skip_defaults:
        factories.update({name: _deferred(mod) for name, mod in DEFAULT_SCHEDULER_MODULES.items()})
    for name, loader in load_group(group).items():
        factories[name] = _plugin(loader)
    return factories


def _plugin(loader: Callable[[], Any]) -> SchedulerFactory:
    def factory(session_name: str, **kwargs: Any) -> Scheduler:
        return loader()(session_name, **kwargs)

    return factory


def get_default_scheduler_name() -> str:
    """``local_cwd``: the scheduler that works on any machine (upstream's default needs Docker)."""
    return "local_cwd"
