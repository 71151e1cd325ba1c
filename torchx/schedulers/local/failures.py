"""Why a replica failed: the exception that ended it, and the rank that raised it.

torchelastic writes a reply file (``TORCHELASTIC_ERROR_FILE``) only for a program whose
main is decorated with ``@record``; otherwise the exception is only in the replica's
stderr, where torchrun interleaves its ranks' lines behind prefixes (``[1]:[rank1]:``,
``[default1]:``) and ends with its own ``ChildFailedError``, whose "Root Cause" names the
rank that failed first. Stdlib only: the supervisor imports it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

# the end of a stderr that is read: a traceback is near the end, a log may be huge
TAIL_BYTES = 1 << 20

_TRACEBACK = "Traceback (most recent call last):"
# torchrun's prefixes: the local rank ("[1]:", "[default1]:"), then torch's "[rank1]:"
_PREFIX = re.compile(r"^((?:\[[^\]\s]*?\d+\]:)+) ?")
_SEGMENT = re.compile(r"\[([^\]\s]*?)(\d+)\]:")
# "ValueError: boom", "pkg.mod.Error: x", "KeyboardInterrupt"
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?::|$)")
_ROOT_CAUSE = "Root Cause (first observed failure):"
_RANK = re.compile(r"^rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_ERROR_FILE = re.compile(r"^error_file\s*:\s*(\S+)")


@dataclass(frozen=True)
class Failure:
    """The exception line (``ValueError: boom``) and the global rank that raised it."""

    error: str
    rank: Optional[int] = None

    def __str__(self) -> str:
        return self.error if self.rank is None else f"rank {self.rank}: {self.error}"


@dataclass(frozen=True)
class RootCause:
    """What torchrun's ``ChildFailedError`` names as the first failure of its workers."""

    rank: int
    local_rank: int
    error_file: Optional[str]


def find(stderr_path: str, error_file: str) -> Optional[Failure]:
    """The failure of a replica: its reply file's exception if torchelastic wrote one
    (the agent's copy, else the failed worker's own), else its stderr's last traceback
    (of the rank torchrun names, when it names one)."""
    text = read_tail(stderr_path)
    cause = root_cause(text)
    rank = cause.rank if cause else None
    for path in (error_file, cause.error_file if cause else None):
        if path and (error := reply_error(path)):
            return Failure(error, rank)
    return last_traceback(text, cause)


def read_tail(path: str, size: int = TAIL_BYTES) -> str:
    """The last ``size`` bytes of a log, decoded; "" if it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def reply_error(path: str) -> str:
    """The exception line of a torchelastic reply file ("" if there is none): its
    ``message`` is ``ExcType: text`` (``@record``), plain or nested under ``message``."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return ""
    message = data.get("message", "") if isinstance(data, dict) else ""
    if isinstance(message, dict):
        message = message.get("message", "")
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    exceptions = [ln for ln in lines if _EXCEPTION.match(ln) and not ln.startswith("File ")]
    return (exceptions or lines or [""])[-1]


def split_prefix(line: str) -> Tuple[str, str]:
    """``(prefix, body)`` of a log line: torchrun's rank prefixes, then the rest."""
    m = _PREFIX.match(line)
    return (m.group(1), line[m.end() :]) if m else ("", line)


def prefix_ranks(prefix: str) -> Tuple[Optional[int], Optional[int]]:
    """``(global rank, local rank)`` a prefix names: ``[rankN]`` is global (torch's),
    ``[N]`` or ``[<role>N]`` local (torchrun's)."""
    rank = local = None
    for name, number in _SEGMENT.findall(prefix):
        if name == "rank":
            rank = int(number)
        else:
            local = int(number)
    return rank, local


def root_cause(text: str) -> Optional[RootCause]:
    """The last "Root Cause" torchrun printed in ``text``: the failed rank, its error file."""
    lines = [ln.strip() for ln in text.splitlines()]
    starts = [i for i, ln in enumerate(lines) if ln == _ROOT_CAUSE]
    if not starts:
        return None
    ranks: Optional[Tuple[int, int]] = None
    error_file: Optional[str] = None
    for ln in lines[starts[-1] + 1 :]:
        if ln.startswith("===="):
            break
        if m := _RANK.match(ln):
            ranks = int(m.group(1)), int(m.group(2))
        elif m := _ERROR_FILE.match(ln):
            error_file = None if m.group(1) == "<N/A>" else m.group(1)
    return RootCause(ranks[0], ranks[1], error_file) if ranks else None


def tracebacks(text: str) -> List[Tuple[str, str]]:
    """``(prefix, exception line)`` of every traceback in ``text``, in order, each read in
    its own prefix's lines (ranks' lines interleave)."""
    pending: Dict[str, bool] = {}  # prefix -> inside a traceback, before its exception
    found: List[Tuple[str, str]] = []
    for line in text.splitlines():
        prefix, body = split_prefix(line.rstrip())
        if body.strip() == _TRACEBACK:
            pending[prefix] = True
        elif pending.get(prefix) and body[:1] not in ("", " ", "\t") and _EXCEPTION.match(body):
            pending[prefix] = False
            found.append((prefix, body.strip()))
    return found


def last_traceback(text: str, cause: Optional[RootCause] = None) -> Optional[Failure]:
    """The last traceback's exception: of ``cause``'s rank if torchrun named one (its own
    ``ChildFailedError`` and the ranks it stopped come after), else of any rank."""
    candidates = []
    for prefix, error in tracebacks(text):
        rank, local = prefix_ranks(prefix)
        if cause is None and not error.split(":")[0].endswith("ChildFailedError"):
            candidates.append(Failure(error, rank if rank is not None else local))
        elif cause is not None and (
            rank == cause.rank or (rank is None and local == cause.local_rank)
        ):
            candidates.append(Failure(error, cause.rank))
    return candidates[-1] if candidates else None
