"""Training progress from a rank: ``report_progress(step, total=None, **metrics)``.

Why a file and not the tracker: a report must cost next to nothing and never block a
training step, so it is one small atomic file write (write a temp file, rename), at most
every ``MIN_INTERVAL`` seconds, with no import beyond the stdlib and no network. The
launcher tells the job where to write through ``TORCHX_PROGRESS_FILE`` (``local_cwd``:
``progress.json`` in the app's directory; a scheduler with a shared job directory, e.g.
Slurm, can point it there). Without that variable a report does nothing.

Only rank 0 counts (``RANK`` as torchrun sets it; a process outside torchrun counts), so
a multi-rank job reports once per step. Errors are logged once and then ignored.

Readers (``Runner.progress``, ``torchx status``, a scheduler's stall check) see the last
report: its step, total, metrics, when it was written and the recent rate.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Optional, Tuple

logger = logging.getLogger(__name__)

ENV_PROGRESS_FILE = "TORCHX_PROGRESS_FILE"
# reports closer together than this are skipped (the next one carries the newer step)
MIN_INTERVAL = 0.05
# the rate is measured over the last this-many written reports
RATE_WINDOW = 16

__all__ = ["ENV_PROGRESS_FILE", "Progress", "read_progress", "report_progress"]


@dataclass
class Progress:
    """The last progress report of a job (what ``torchx status`` shows)."""

    step: int
    total: Optional[int] = None
    time: float = 0.0  # when it was reported (epoch seconds)
    rate: Optional[float] = None  # steps per second, over the recent reports
    metrics: Dict[str, float] = field(default_factory=dict)

    def age(self, now: Optional[float] = None) -> float:
        """Seconds since the report."""
        return max(0.0, (time.time() if now is None else now) - self.time)

    def eta(self) -> Optional[float]:
        """Seconds left at the current rate (None without a total or a rate)."""
        if self.total is None or not self.rate or self.rate <= 0:
            return None
        return max(0.0, (self.total - self.step) / self.rate)

    def format(self, running: bool = True, now: Optional[float] = None) -> str:
        """``step 45/100, 2.0 steps/s, ETA 28s, last report 0.4s ago`` (no ETA once ended)."""
        parts = [f"step {self.step}" + (f"/{self.total}" if self.total is not None else "")]
        if self.rate is not None:
            parts.append(f"{self.rate:.3g} steps/s")
        eta = self.eta()
        if running and eta is not None:
            parts.append(f"ETA {_duration(eta)}")
        parts.append(f"last report {_duration(self.age(now))} ago")
        return ", ".join(parts)

    def to_json(self) -> Dict[str, Any]:
        return {
            "step": self.step,
            "total": self.total,
            "time": self.time,
            "rate": self.rate,
            "metrics": dict(self.metrics),
        }


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def read_progress(path: Optional[str]) -> Optional[Progress]:
    """The last report written to ``path`` (None if there is none or it is unreadable)."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
        step = doc["step"]
        if not isinstance(step, int):
            return None
        metrics = doc.get("metrics") or {}
        return Progress(
            step=step,
            total=doc.get("total") if isinstance(doc.get("total"), int) else None,
            time=float(doc.get("time", 0.0)),
            rate=float(doc["rate"]) if isinstance(doc.get("rate"), (int, float)) else None,
            metrics={k: v for k, v in metrics.items() if isinstance(v, (int, float))},
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


class _Reporter:
    """Per-process writer state: where to write, the recent reports, one warning."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.path: Optional[str] = None
        self.enabled: Optional[bool] = None
        self.last_write = 0.0
        self.history: Deque[Tuple[float, int]] = deque(maxlen=RATE_WINDOW)
        self.warned = False

    def _setup(self) -> bool:
        if self.enabled is None:
            rank = os.environ.get("RANK", "0")
            self.path = os.environ.get(ENV_PROGRESS_FILE) or None
            self.enabled = bool(self.path) and rank.strip() in ("0", "")
        return bool(self.enabled)

    def report(self, step: int, total: Optional[int], metrics: Dict[str, Any]) -> None:
        if not self._setup():
            return
        now = time.time()
        if not self.lock.acquire(blocking=False):
            return  # another thread of this rank is writing: never wait
        try:
            final = total is not None and step >= total
            if now - self.last_write < MIN_INTERVAL and not final:
                return
            self.history.append((now, step))
            t0, s0 = self.history[0]
            rate = (step - s0) / (now - t0) if now > t0 and step >= s0 else None
            doc = {
                "step": step,
                "total": total,
                "time": now,
                "rate": rate,
                "metrics": _numbers(metrics),
            }
            _write_atomic(self.path, json.dumps(doc))  # type: ignore[arg-type]
            self.last_write = now
        except Exception as e:  # never break training over a progress report
            if not self.warned:
                self.warned = True
                logger.warning("report_progress: cannot write %s (%s); ignoring", self.path, e)
        finally:
            self.lock.release()


def _numbers(metrics: Dict[str, Any]) -> Dict[str, float]:
    out: Dict[str, float] = {}
    for k, v in metrics.items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out[str(k)] = f
    return out


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


_REPORTER = _Reporter()


def report_progress(step: int, total: Optional[int] = None, **metrics: Any) -> None:
    """Report that training reached ``step`` (of ``total``), with optional numeric metrics.

    Cheap and safe to call every step: only rank 0 writes, at most every
    ``MIN_INTERVAL`` s (and always the final step), and failures are swallowed after one
    warning. Does nothing when the launcher gave the job no ``TORCHX_PROGRESS_FILE``.
    """
    _REPORTER.report(int(step), None if total is None else int(total), metrics)
