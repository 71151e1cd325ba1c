"""Activity records: how a torchx job on Ray tells any reader of its log how long its
replicas have been silent and what they last reported.

Ray's dashboard gives every process that reaches it a job's log, and nothing a running
driver can update otherwise (metadata is fixed at submission). So the driver
(``ray_driver``) prints, among the replicas' lines, a ``torchx-activity {json}`` line:

- ``silence``: how long the replicas had been silent (no output, progress report or exit)
  when the driver asked them, measured on their nodes;
- ``checked``: when it asked (the driver's clock); ``running``: how many still run;
- ``progress``: the first replica's last progress report (``report_progress``), if any.

It prints one when something changed (a report, a replica ended), while the replicas are
silent (every ``PUBLISH_INTERVAL`` s at first, then every tenth of the silence: a silent
hour adds about a hundred lines, not thousands), and at least every ``HEARTBEAT`` s. A
replica's line after the last record therefore means "active within a round or two"; a
record older than ``STALE_AFTER`` means the driver stopped answering: cannot tell.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import List, Optional

RECORD = "torchx-activity "
PUBLISH_INTERVAL = 1.0  # how often the driver asks its replicas
HEARTBEAT = 60.0  # a record at least this often, however busy the replicas are
STALE_AFTER = 2.5 * HEARTBEAT  # an older last record: the driver stopped answering
# what Ray puts before an actor's line: "(Replica pid=12) ", maybe in color
ACTOR_PREFIX = re.compile(r"^(\x1b\[[0-9;]*m)?\([^)]*pid=\d+[^)]*\)(\x1b\[[0-9;]*m)?\s")
_REPLICA_LINE = re.compile(r"^\S+/\d+ ")


@dataclass(frozen=True)
class Activity:
    silence: float
    checked: float
    running: int
    progress: Optional[str] = None

    def line(self) -> str:
        return RECORD + json.dumps(
            {
                "silence": round(self.silence, 3),
                "checked": round(self.checked, 3),
                "running": self.running,
                "progress": self.progress,
            }
        )


def due(now: Activity, last: Optional[Activity]) -> bool:
    """Whether the driver prints ``now``, having last printed ``last`` (module docstring)."""
    if last is None or now.progress != last.progress or now.running != last.running:
        return True
    since = now.checked - last.checked
    if since >= HEARTBEAT:
        return True
    return now.silence >= PUBLISH_INTERVAL and since >= max(PUBLISH_INTERVAL, now.silence / 10)


def parse(line: str) -> Optional[Activity]:
    """The record on ``line`` (Ray's actor prefix allowed), or None."""
    line = ACTOR_PREFIX.sub("", line)
    if not line.startswith(RECORD):
        return None
    try:
        doc = json.loads(line[len(RECORD) :])
        progress = doc.get("progress")
        return Activity(
            float(doc["silence"]),
            float(doc["checked"]),
            int(doc["running"]),
            progress if isinstance(progress, str) else None,
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


@dataclass(frozen=True)
class LastRecord:
    """The log's last record, and whether a replica printed after it."""

    activity: Activity
    output_after: bool


def last_record(lines: List[str]) -> Optional[LastRecord]:
    output_after = False
    for line in reversed(lines):
        record = parse(line)
        if record is not None:
            return LastRecord(record, output_after)
        output_after = output_after or bool(_REPLICA_LINE.match(ACTOR_PREFIX.sub("", line)))
    return None


def last_progress(lines: List[str]) -> Optional[str]:
    """The newest progress report any record in ``lines`` carries."""
    for line in reversed(lines):
        record = parse(line)
        if record is not None and record.progress:
            return record.progress
    return None


def last_activity(found: Optional[LastRecord], now: float) -> Optional[float]:
    """Epoch seconds of the replicas' last activity as the log shows it, None if it cannot
    tell (no record yet, a stale one, or no replica runs: the job is ending, not stalled).

    Only the silence the replicas' nodes measured counts (``now - silence``): a record read
    late or clock skew between nodes never makes a job that prints look silent."""
    if found is None:
        return None
    record = found.activity
    if now - record.checked > STALE_AFTER or record.running == 0:
        return None
    if found.output_after:
        return now
    return now - record.silence
