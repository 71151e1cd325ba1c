"""The contract every ``torchx`` sub-command implements (upstream-compatible)."""

from __future__ import annotations

import abc
import argparse
from typing import ClassVar


class SubCommand(abc.ABC):
    """One CLI verb; ``run`` raises a ``TorchXError`` or ``CommandError`` for a user error."""

    #: False: the verb declares its own help flag (``torchx torchrun`` takes ``-h`` as the
    #: named resource, as ``dist.ddp`` does, and keeps ``--help``)
    add_help: ClassVar[bool] = True

    @abc.abstractmethod
    def add_arguments(self, subparser: argparse.ArgumentParser) -> None: ...

    @abc.abstractmethod
    def run(self, args: argparse.Namespace) -> None: ...


class CommandError(Exception):
    """A user error detected by a CLI verb; main prints its message and exits with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def no_such_app(handle: str, scheduler: str = "SCHEDULER") -> CommandError:
    """The line a verb gives for an app its scheduler does not know."""
    return CommandError(f"app {handle} does not exist (see `torchx list -s {scheduler}`)")
