"""Polling up to a deadline, for tests that wait on another process (never sleep-then-assert)."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def poll_until(
    fetch: Callable[[], T], done: Callable[[T], bool], timeout: float = 60, every: float = 0.1
) -> T:
    """``fetch()`` until ``done`` holds or the deadline passes; the last value either way,
    so the caller's assert shows what was seen."""
    deadline = time.monotonic() + timeout
    value = fetch()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(every)
        value = fetch()
    return value
