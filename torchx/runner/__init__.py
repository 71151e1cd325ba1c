"""Submit and manage apps on any scheduler: ``get_runner()``."""

from torchx.runner.api import Runner, get_runner

__all__ = ["Runner", "get_runner"]
