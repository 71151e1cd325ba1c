"""Training progress from a rank: ``report_progress(step, total=None, **metrics)``.

A report is one small atomic file write (``TORCHX_PROGRESS_FILE``, stdlib only), so it never
holds a training step; in a tracked job rank 0 also sends it to the job's tracker run, in
batches. Readers, limits and the tracker's metrics: docs/progress.md.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Mapping, Optional, Tuple

logger = logging.getLogger(__name__)

ENV_PROGRESS_FILE = "TORCHX_PROGRESS_FILE"
# seconds between batched sends to the tracker run
ENV_PROGRESS_INTERVAL = "TORCHX_PROGRESS_INTERVAL"
# at the main thread's end, the interpreter's exit waits at most this long for the last send
FINAL_SEND_WAIT = 10.0
_METRIC_NAME = re.compile(r"[\w\-. /:]{1,250}")  # names MLflow accepts
PROGRESS_KEYS = ("progress_step", "progress_total", "progress_rate")
# reports closer together than this are skipped (the next one carries the newer step)
MIN_INTERVAL = 0.05
# the rate is measured over the last this-many written reports
RATE_WINDOW = 16
# reports waiting for the tracker run at most (past that the oldest are dropped)
MAX_QUEUED = 10_000

__all__ = [
    "ENV_PROGRESS_FILE",
    "Progress",
    "progress_from_metrics",
    "read_progress",
    "report_progress",
]


@dataclass
class Progress:
    """The last progress report of a job (what ``torchx status`` shows)."""

    step: int
    total: Optional[int] = None
    time: float = 0.0  # when it was reported (epoch seconds)
    rate: Optional[float] = None  # steps per second, over the recent reports
    metrics: Dict[str, float] = field(default_factory=dict)
    from_tracker: bool = False  # read back from the job's tracker run (it is there already)

    def as_metrics(self) -> Dict[str, float]:
        """As run metrics: ``progress_step``, ``progress_total`` and ``progress_rate``
        (steps/s) when known, and the reported metrics (finite, names MLflow accepts)."""
        out = {"progress_step": float(self.step)}
        if self.total is not None:
            out["progress_total"] = float(self.total)
        if self.rate is not None:
            out["progress_rate"] = float(self.rate)
        for key, value in self.metrics.items():
            if _METRIC_NAME.fullmatch(key) and key not in out:
                out[key] = float(value)
        return {k: v for k, v in out.items() if math.isfinite(v)}

    @property
    def time_ms(self) -> int:
        """When it was reported, as the tracker run records it (epoch ms)."""
        return int(self.time * 1000)

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
        doc = dataclasses.asdict(self)
        del doc["from_tracker"]  # how it was read, not part of the report
        return doc


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


def progress_from_metrics(latest: Mapping[str, Tuple[float, int]]) -> Optional[Progress]:
    """The last report as a rank sent it to its tracker run, from the run's latest metrics
    ``{key: (value, timestamp ms)}``; None without ``progress_step``. The reported metrics
    are those sent with that step (the same timestamp)."""
    if "progress_step" not in latest:
        return None
    step, ts = latest["progress_step"]
    total, rate = latest.get("progress_total"), latest.get("progress_rate")
    metrics = {k: float(v) for k, (v, t) in latest.items() if t == ts and k not in PROGRESS_KEYS}
    return Progress(
        step=int(step),
        total=int(total[0]) if total is not None and total[1] == ts else None,
        time=ts / 1000.0,
        rate=float(rate[0]) if rate is not None and rate[1] == ts else None,
        metrics=metrics,
        from_tracker=True,
    )


class _TrackerSender:
    """Sends a rank's reports to the job's tracker run from a thread of its own, batched every
    ``TORCHX_PROGRESS_INTERVAL`` s, so a slow or unreachable store never holds a training
    step (docs/progress.md: what is dropped, and when)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queued: Deque[Progress] = deque(maxlen=MAX_QUEUED)
        self.sending = False  # a batch is on its way
        self.urgent = False  # flush: send what is queued now
        self.started = False
        self.warned = False
        self.warned_full = False
        try:
            self.interval = max(0.1, float(os.environ.get(ENV_PROGRESS_INTERVAL, "10")))
        except ValueError:
            self.interval = 10.0

    def offer(self, report: Progress, final: bool) -> None:
        with self.cond:
            if len(self.queued) == MAX_QUEUED and not self.warned_full:
                self.warned_full = True
                logger.warning(
                    "report_progress: %d reports wait for the tracker; dropping the oldest",
                    MAX_QUEUED,
                )
            self.queued.append(report)
            if not self.started:
                self.started = True
                threading.Thread(target=self._loop, name="torchx-progress", daemon=True).start()
                # not a daemon: it holds the interpreter's exit for the last flush (bounded)
                threading.Thread(target=self._flush_at_exit, name="torchx-progress-exit").start()
        if final:
            self.flush(0.0)  # never hold training: the exit waits for it if it must

    def flush(self, timeout: float) -> bool:
        """Send what is queued now; wait at most ``timeout`` s for it (False: not sent yet)."""
        with self.cond:
            self.urgent = True
            self.cond.notify_all()
            return self.cond.wait_for(lambda: not self.queued and not self.sending, timeout)

    def _flush_at_exit(self) -> None:
        threading.main_thread().join()  # returns when the main thread ends (interpreter exit)
        self.flush(FINAL_SEND_WAIT)

    def _loop(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.urgent, self.interval)
                batch, self.urgent = list(self.queued), False
                self.queued.clear()
                self.sending = bool(batch)
            if batch:
                self._send(batch)
            with self.cond:
                self.sending = False
                self.cond.notify_all()

    def _send(self, batch: List[Progress]) -> None:
        from torchx.specs.errors import backend_errors  # here: a training script loads us

        try:
            from torchx.trackers.api import app_run_from_env

            steps = [(r.as_metrics(), r.step, r.time_ms) for r in batch]
            app_run_from_env().log_metrics_batch(steps)
        except backend_errors() as e:  # never break training over a progress report
            if not self.warned:
                self.warned = True
                logger.warning("report_progress: cannot reach the tracker (%s); ignoring", e)


class _Reporter:
    """Per-process writer state: where to write, the recent reports, one warning."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.path: Optional[str] = None
        self.enabled: Optional[bool] = None
        self.last_write = 0.0
        self.history: Deque[Tuple[float, int]] = deque(maxlen=RATE_WINDOW)
        self.warned = False
        self.sender: Optional[_TrackerSender] = None  # a tracked job: the tracker run too

    def _setup(self) -> bool:
        if self.enabled is None:
            rank0 = os.environ.get("RANK", "0").strip() in ("0", "")
            self.path = os.environ.get(ENV_PROGRESS_FILE) or None
            # a job tracked from its ranks: rank 0 sends every report to the job's run
            # itself, and a waiting Runner logs none (no duplicate points)
            if rank0 and os.environ.get("TORCHX_TRACKERS") and os.environ.get("TORCHX_JOB_ID"):
                self.sender = _TrackerSender()
            self.enabled = rank0 and bool(self.path or self.sender)
        return bool(self.enabled)

    def report(self, step: int, total: Optional[int], metrics: Dict[str, Any]) -> None:
        if not self._setup():
            return
        now = time.time()
        if not self.lock.acquire(blocking=False):
            return  # another thread of this rank is writing: never wait
        try:
            final = total is not None and step >= total
            write = final or now - self.last_write >= MIN_INTERVAL
            if write:
                self.history.append((now, step))
            t0, s0 = self.history[0] if self.history else (now, step)
            rate = (step - s0) / (now - t0) if now > t0 and step >= s0 else None
            report = Progress(step, total, now, rate, _numbers(metrics))
            if self.sender is not None:  # every report, not only the written ones
                self.sender.offer(report, final)
            if write:
                self.last_write = now
                if self.path:
                    _write_atomic(self.path, json.dumps(report.to_json()))
        except (OSError, TypeError, ValueError, RuntimeError) as e:  # disk full, no thread left
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
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "wb") as f:
        f.write(text.encode())
    os.replace(tmp, path)


_REPORTER = _Reporter()


def report_progress(step: int, total: Optional[int] = None, **metrics: Any) -> None:
    """Report that training reached ``step`` (of ``total``), with optional numeric metrics.

    Cheap and safe to call every step: only rank 0 writes, at most every
    ``MIN_INTERVAL`` s (and always the final step), and failures are swallowed after one
    warning. Does nothing when the launcher gave the job no ``TORCHX_PROGRESS_FILE``.
    """
    _REPORTER.report(int(step), None if total is None else int(total), metrics)
