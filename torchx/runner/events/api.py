"""Upstream's ``torchx.runner.events.api``: the event record types (defined in the package)."""

from torchx.runner.events import SourceType, TorchxEvent

__all__ = ["SourceType", "TorchxEvent"]
