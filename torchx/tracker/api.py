"""Upstream import path ``torchx.tracker.api``."""

from torchx.trackers.api import *  # noqa: F401,F403
