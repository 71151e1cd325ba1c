"""Upstream import path ``torchx.tracker.mlflow``."""

from torchx.trackers.mlflow_backend import MLflowTracker, create  # noqa: F401

create_tracker = create
