"""Training progress from a rank: ``report_progress(step, total=None, **metrics)``.

A report is one small atomic file write (``TORCHX_PROGRESS_FILE``, stdlib only), so it never
holds a training step; in a tracked job rank 0 also sends it to the job's tracker run, in
batches. Readers, limits and the tracker's metrics: docs/progress.md.

Writes are throttled (``MIN_INTERVAL``), never dropped: a report that comes too soon is kept
and written when the interval ends, by the next report or, if none comes, by a short-lived
writer thread (it ends with that write; not a daemon, so a rank that returns or raises right
after its last report waits one interval at most for it). The last report before a rank ends
or crashes reaches the file, and ``torchx status`` shows it. Only ``os._exit`` or a kill
within the interval loses it.

Measured on this project's dev machine (ext4, 2 cores, loaded): one atomic write (temp file
and rename over the last) takes 0.9-1.6 ms, as ext4 flushes a file renamed over another, too
much for every step of a fast loop; a throttled ``report_progress`` call takes 6-16 us
(the old, dropping code: 6-9 us on the same run).
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
# at most one file write per this many seconds (a report in between is written when it ends)
MIN_INTERVAL = 0.05
# a report waits at most this long for another thread's write (else it is skipped)
LOCK_WAIT = 1.0
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
    """Per-process writer state: where to write, the recent reports, the report waiting for
    its write (throttled, never dropped), one warning."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held for a state change, or one file write at most
        self.path: Optional[str] = None
        self.enabled: Optional[bool] = None
        self.last_write = 0.0
        self.history: Deque[Tuple[float, int]] = deque(maxlen=RATE_WINDOW)
        self.pending: Optional[Progress] = None  # throttled: the trailing write carries it
        self.writer_pid = 0  # the process whose trailing writer is armed (0: none)
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
        # held by another thread for one write at most; a report never waits longer
        if not self.lock.acquire(timeout=LOCK_WAIT):
            return
        try:
            now = time.time()
            if not self.history or now - self.history[-1][0] >= MIN_INTERVAL:
                self.history.append((now, step))
            t0, s0 = self.history[0]
            rate = (step - s0) / (now - t0) if now > t0 and step >= s0 else None
            report = Progress(step, total, now, rate, _numbers(metrics))
            final = total is not None and step >= total
            if self.sender is not None:  # every report, not only the written ones
                self.sender.offer(report, final)
            if not self.path:
                return
            if final or now - self.last_write >= MIN_INTERVAL:
                self.pending = None
                self._write(report, now)
                return
            # throttled: kept, and written when the interval ends (by the next report,
            # or by the trailing writer if none comes, as when the rank ends or crashes)
            self.pending = report
            if self.writer_pid != os.getpid():  # none armed here (a fork copies the flag)
                self.writer_pid = os.getpid()
                # not a daemon: the interpreter's exit waits for it (one interval at most)
                threading.Thread(target=self._write_later, name="torchx-progress-write").start()
        except (OSError, TypeError, ValueError, RuntimeError) as e:  # disk full, no thread
            self._warn(e)
        finally:
            self.lock.release()

    def _write_later(self) -> None:
        """The trailing write: the last throttled report, once the interval has passed."""
        while True:
            with self.lock:
                wait = self.last_write + MIN_INTERVAL - time.time()
                if wait <= 0 or self.pending is None:
                    report, self.pending, self.writer_pid = self.pending, None, 0
                    try:
                        if report is not None:
                            self._write(report, time.time())
                    except OSError as e:
                        self._warn(e)
                    return
            time.sleep(wait)

    def _write(self, report: Progress, now: float) -> None:
        self.last_write = now
        assert self.path is not None
        _write_atomic(self.path, json.dumps(report.to_json()))

    def _warn(self, e: BaseException) -> None:
        if not self.warned:
            self.warned = True
            logger.warning("report_progress: cannot write %s (%s); ignoring", self.path, e)


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
    """``text`` replaces ``path`` at once: a fresh temp file of a random name beside it
    (``O_EXCL|O_NOFOLLOW``: never one planted there, nor through a link), then a rename."""
    tmp = f"{path}.{os.urandom(8).hex()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600)
    try:
        with open(fd, "wb") as f:
            f.write(text.encode())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_REPORTER = _Reporter()


def report_progress(step: int, total: Optional[int] = None, **metrics: Any) -> None:
    """Report that training reached ``step`` (of ``total``), with optional numeric metrics.

    Cheap and safe to call every step: only rank 0 writes, at most every
    ``MIN_INTERVAL`` s (the final step at once); a report in between is written when the
    interval ends, so the last one is never lost. Failures are swallowed after one
    warning. Does nothing when the launcher gave the job no ``TORCHX_PROGRESS_FILE``.
    """
    _REPORTER.report(int(step), None if total is None else int(total), metrics)
