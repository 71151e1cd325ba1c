"""Upstream's ``torchx.runner.events.handlers``: handlers for the ``torchx-events-*`` loggers.

Events are recorded only when their logger has a handler; add one to see them, e.g.
``logging.getLogger("torchx-events-null").addHandler(get_logging_handler("console"))``.
"""

from __future__ import annotations

import logging


def get_logging_handler(destination: str = "null") -> logging.Handler:
    """A new handler for ``destination``: ``console`` (stderr) or ``null`` (discard)."""
    handlers = {"console": logging.StreamHandler, "null": logging.NullHandler}
    if destination not in handlers:
        raise ValueError(
            f"unknown event destination {destination!r}; use one of {', '.join(handlers)}"
        )
    return handlers[destination]()
