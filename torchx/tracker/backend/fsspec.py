"""Upstream import path ``torchx.tracker.backend.fsspec``."""

from torchx.trackers.fsspec_backend import FsspecTracker, create  # noqa: F401
