"""Usage events for Runner API calls, logged to ``torchx-events-<destination>`` loggers.

Upstream-compatible names (``TorchxEvent``, ``SourceType``, ``record``, ``log_event``);
by default events go to a logger with no handlers, so they cost almost nothing.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from dataclasses import asdict, dataclass
from enum import Enum
from types import TracebackType
from typing import Any, Dict, Optional, Type

from torchx.runner.events.handlers import get_logging_handler  # noqa: F401 (upstream's name)


class SourceType(str, Enum):
    UNKNOWN = "<unknown>"
    INTERNAL = "INTERNAL"
    EXTERNAL = "EXTERNAL"


@dataclass
class TorchxEvent:
    session: str
    scheduler: str
    api: str
    app_id: Optional[str] = None
    app_image: Optional[str] = None
    app_metadata: Optional[Dict[str, str]] = None
    runcfg: Optional[str] = None
    raw_exception: Optional[str] = None
    source: SourceType = SourceType.UNKNOWN
    cpu_time_usec: Optional[int] = None
    wall_time_usec: Optional[int] = None
    start_epoch_time_usec: Optional[int] = None
    workspace: Optional[str] = None
    exception_type: Optional[str] = None
    exception_message: Optional[str] = None
    exception_source_location: Optional[str] = None

    def serialize(self) -> str:
        return json.dumps(asdict(self), default=str)

    @staticmethod
    def deserialize(data: str) -> TorchxEvent:
        d = json.loads(data)
        d["source"] = SourceType(d.get("source", SourceType.UNKNOWN))
        return TorchxEvent(**d)


def record(event: TorchxEvent, destination: str = "null") -> None:
    logger = logging.getLogger(f"torchx-events-{destination}")
    logger.propagate = False
    if logger.isEnabledFor(logging.INFO) and logger.handlers:
        logger.info(event.serialize())


class log_event:  # upstream's (lowercase) name
    """Time the wrapped Runner call and record it (with the exception, if any);
    ``with log_event(...) as event`` gives the ``TorchxEvent`` to fill in."""

    def __init__(
        self,
        api: str,
        scheduler: Optional[str] = None,
        app_id: Optional[str] = None,
        app_image: Optional[str] = None,
        app_metadata: Optional[Dict[str, str]] = None,
        runcfg: Any = None,
        workspace: Optional[str] = None,
    ) -> None:
        self.event = TorchxEvent(
            session="torchx",
            scheduler=scheduler or "",
            api=api,
            app_id=app_id,
            app_image=app_image,
            app_metadata=app_metadata,
            runcfg=json.dumps(runcfg, default=str) if runcfg is not None else None,
            workspace=workspace,
        )

    def __enter__(self) -> TorchxEvent:
        self._start_wall, self._start_cpu = time.perf_counter_ns(), time.process_time_ns()
        self.event.start_epoch_time_usec = time.time_ns() // 1000
        return self.event

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        event = self.event
        if exc is not None:  # recorded, then raised on (``__exit__`` returns None)
            event.raw_exception = "".join(traceback.format_exception(exc_type, exc, tb))
            event.exception_type = type(exc).__name__
            event.exception_message = str(exc)
        event.wall_time_usec = (time.perf_counter_ns() - self._start_wall) // 1000
        event.cpu_time_usec = (time.process_time_ns() - self._start_cpu) // 1000
        record(event)
