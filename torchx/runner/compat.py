"""Upstream's module-level names of ``torchx.runner.api`` that are thin wrappers here
(imported lazily, so ``import torchx.runner`` stays fast); ``torchx.runner.api`` re-exports
them."""

from __future__ import annotations

from typing import Any

from torchx.runner import config as torchx_config
from torchx.specs.api import AppDef


def get_component(name: str) -> Any:
    """Upstream's ``torchx.runner.api.get_component``: the component's ``_Component``."""
    from torchx.specs.finder import get_component as find

    return find(name)


def materialize_appdef(*args: Any, **kwargs: Any) -> AppDef:
    """Upstream's ``torchx.runner.api.materialize_appdef`` (see ``torchx.specs.builders``)."""
    from torchx.specs.builders import materialize_appdef as materialize

    return materialize(*args, **kwargs)


# upstream's names, imported here from .config
get_configured_trackers = torchx_config.get_configured_trackers
get_configs = torchx_config.get_configs
get_config = torchx_config.get_config
NONE = "<NONE>"  # upstream's torchx.runner.api.NONE (the same as torchx.specs.NONE)
