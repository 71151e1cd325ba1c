"""Polling up to a deadline, for tests that wait on another process (never sleep-then-assert)."""

from __future__ import annotations

import time
from typing import Callable, Optional, TypeVar

import pytest

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


def poll(
    fn: Callable[[], Optional[T]], timeout: float = 60, what: str = "", every: float = 0.02
) -> T:
    """``fn()``'s first truthy value, checked every ``every`` s (20 ms: for a cheap ``fn``;
    a costly one polled that often takes the CPU from the processes it waits for); fails
    after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:.0f} s: {what or fn}")
        time.sleep(every)
