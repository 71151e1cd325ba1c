"""Upstream import path (``torchx.tracker``); the implementation lives in ``torchx.trackers``."""

from torchx.trackers import *  # noqa: F401,F403
from torchx.trackers import __all__  # noqa: F401
