"""``join`` of a command line (upstream's ``torchx.util.shlex``; same as ``shlex.join``)."""

from __future__ import annotations

import shlex
from typing import Iterable


def join(args: Iterable[str]) -> str:
    """The arguments as one shell-safe string."""
    return " ".join(shlex.quote(arg) for arg in args)
