"""Time helpers (upstream's ``torchx.util.datetime``)."""

from __future__ import annotations

from datetime import datetime, timedelta


def get_past_epoch_time(days_past: int) -> int:
    return int((datetime.now() - timedelta(days_past)).timestamp())
