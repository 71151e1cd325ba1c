"""Tracker calls done by a child process, so the caller never imports a backend's client.

``import mlflow`` costs seconds of CPU. Done in a thread it would also hold the GIL
against the training loop (measured: a pure-Python loop ran 3.6x slower beside it), so
the calls go, as JSON lines, to ``python -m torchx.trackers.agent``, which builds the
trackers once and applies the calls in order.

- The agent runs at the lowest CPU priority (``nice 19``), so its imports do not compete
  with the job's ranks for the CPU.
- In a job's rank the agent starts ``RANK_DELAY`` s after the first call (calls are
  buffered until then), so its start-up does not land on the rank's first steps.
- In a job's rank the agent is a plain child: at exit the rank closes its pipe and waits
  for it, so nothing recorded is lost; a read (``sources()``) flushes it first.
- On the launcher (``detach=True``) the agent runs in its own session with its output in
  ``$TORCHX_HOME/tracker-agent.log``: the CLI returns at once and a Ctrl-C does not stop
  the run from being opened or ended.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Any, Dict, Iterable, List, Mapping, Optional, Tuple

from torchx.trackers.api import TrackerArtifact, TrackerBase, TrackerSource, build_trackers

logger = logging.getLogger(__name__)

# env a backend reads when it is built: sent with each call, since a long-lived agent's own
# env may be older than its caller's
ENV_SENT = (
    "MLFLOW_TRACKING_URI",
    "TORCHX_HOME",
    "TORCHX_TRACKING_EXPERIMENT_NAME",
    "TORCHX_MLFLOW_UI_URL",
)
EXIT_TIMEOUT = 600.0  # a rank waits this long at exit for its calls to be recorded
RANK_DELAY = 10.0  # a rank's calls are buffered this long before its agent starts
BUILD_RETRIES = 5  # processes first using a fresh sqlite store at once race on its schema


class Agent:
    """The caller's end: a lazily started child process fed one JSON line per call."""

    def __init__(self, detach: bool = False, delay: float = 0.0) -> None:
        self._detach = detach
        self._delay = delay  # buffer calls this long before starting the child
        self._pending: List[bytes] = []
        self._trackers: List[str] = []  # backends called so far: a host preloads their clients
        self._timer: Optional[threading.Timer] = None
        self._proc: Any = None  # a Popen, or a HostedAgent with the same few methods
        self._pid = 0  # the process that started the child (a fork must start its own)
        self._lock = threading.RLock()
        self._flushes = 0

    def _start(self) -> Any:
        if self._proc is not None and self._pid == os.getpid() and self._proc.poll() is None:
            return self._proc
        from torchx.trackers import agent_host

        err: Any = None
        if self._detach:
            from torchx.util.paths import torchx_home

            err = open(torchx_home() / "tracker-agent.log", "ab")
        try:
            sock = agent_host.connect(
                start=self._detach,
                stderr_fd=err.fileno() if err is not None else 2,
                trackers=self._trackers,
            )
            if sock is not None:
                self._proc = HostedAgent(sock)
            else:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "torchx.trackers.agent"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,  # flush answers (read only while the caller waits)
                    stderr=err,
                    start_new_session=self._detach,
                )
        finally:
            if err is not None:
                err.close()
        self._pid = os.getpid()
        if not self._detach and self._timer is None:
            atexit.register(self.close)
        return self._proc

    def _send(self, message: Mapping[str, Any], now: bool = True) -> None:
        line = (json.dumps(message, default=str) + "\n").encode()
        with self._lock:
            self._pending.append(line)
            started = self._proc is not None and self._pid == os.getpid()
            if now or started or self._delay <= 0:
                self._drain()
            elif self._timer is None:
                atexit.register(self.close)
                self._timer = threading.Timer(self._delay, self._drain)
                self._timer.daemon = True
                self._timer.start()

    def _drain(self) -> Any:
        """Start the child if need be and hand it every pending call."""
        with self._lock:
            proc = self._start()
            assert proc.stdin is not None
            lines, self._pending = self._pending, []
            proc.stdin.write(b"".join(lines))
            proc.stdin.flush()
            return proc

    def call(self, tracker: str, config: Optional[str], method: str, **kwargs: Any) -> None:
        """Queue ``build_trackers({tracker: config})[0].<method>(**kwargs)``."""
        env = {k: os.environ.get(k) for k in ENV_SENT}
        if tracker not in self._trackers:
            self._trackers.append(tracker)
        self._send(
            {"tracker": tracker, "config": config, "method": method, "kwargs": kwargs, "env": env},
            now=False,
        )

    def flush(self) -> None:
        """Return once every call sent so far is applied (no-op if none were sent)."""
        if self._proc is None and not self._pending:
            return
        self._flushes += 1
        token = str(self._flushes)
        self._send({"flush": token})
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        for line in proc.stdout:
            if line.decode().strip() == token:
                return

    def close(self, timeout: float = EXIT_TIMEOUT) -> None:
        """No more calls; a non-detached agent is waited for (its calls are applied)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._pending:
                self._drain()
            proc, self._proc = self._proc, None
        if proc is None or self._pid != os.getpid():
            return
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:  # the agent is gone already
                pass
        if self._detach:
            return
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            logger.warning("tracker agent did not finish within %.0f s; stopping it", timeout)
            proc.kill()


class _SocketWriter:
    """The write end of an agent's socket; closing it tells the agent there is no more."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._file = sock.makefile("wb")

    def write(self, data: bytes) -> int:
        return self._file.write(data)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        try:
            self._file.close()
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class HostedAgent:
    """An agent forked by the machine's agent host (``agent_host``), driven like a Popen:
    ``stdin`` takes calls, ``stdout`` gives flush answers, EOF means it is done."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.stdin = _SocketWriter(sock)
        self.stdout = sock.makefile("rb")
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        self._sock.settimeout(timeout)
        try:
            while self.stdout.read(1 << 16):
                pass
        except TimeoutError:
            raise subprocess.TimeoutExpired("tracker agent", timeout or 0) from None
        except OSError:
            pass
        self.returncode = 0
        self._sock.close()
        return 0

    def kill(self) -> None:
        self.returncode = -9
        self._sock.close()


class AgentTracker(TrackerBase):
    """A tracker whose writes go through an :class:`Agent`; reads flush it, then ask the
    backend in-process (built on first read only)."""

    def __init__(self, name: str, config: Optional[str], agent: Agent) -> None:
        self.name = name
        self.config = config
        self.agent = agent
        self._local: Optional[TrackerBase] = None

    def _call(self, method: str, **kwargs: Any) -> None:
        self.agent.call(self.name, self.config, method, **kwargs)

    def _read(self) -> TrackerBase:
        self.agent.flush()
        if self._local is None:
            self._local = build_trackers({self.name: self.config})[0]
        return self._local

    def add_artifact(
        self, run_id: str, name: str, path: str, metadata: Optional[Mapping[str, object]] = None
    ) -> None:
        meta = {k: str(v) for k, v in (metadata or {}).items()} if metadata is not None else None
        self._call("add_artifact", run_id=run_id, name=name, path=path, metadata=meta)

    def add_metadata(self, run_id: str, **kwargs: object) -> None:
        self._call("add_metadata", run_id=run_id, **{k: str(v) for k, v in kwargs.items()})

    def add_source(self, run_id: str, source_id: str, artifact_name: Optional[str] = None) -> None:
        self._call("add_source", run_id=run_id, source_id=source_id, artifact_name=artifact_name)

    def log_metrics(
        self, run_id: str, metrics: Mapping[str, float], step: Optional[int] = None
    ) -> None:
        values = {k: float(v) for k, v in metrics.items()}
        self._call("log_metrics", run_id=run_id, metrics=values, step=step)

    def set_parent(self, run_id: str, parent_run_id: str) -> None:
        self._call("set_parent", run_id=run_id, parent_run_id=parent_run_id)

    def end_run(self, run_id: str, status: str) -> None:
        self._call("end_run", run_id=run_id, status=status)

    def artifacts(self, run_id: str) -> Mapping[str, TrackerArtifact]:
        return self._read().artifacts(run_id)

    def metadata(self, run_id: str) -> Mapping[str, object]:
        return self._read().metadata(run_id)

    def sources(self, run_id: str, artifact_name: Optional[str] = None) -> Iterable[TrackerSource]:
        return self._read().sources(run_id, artifact_name)

    def descendants(self, run_id: str) -> Iterable[TrackerSource]:
        return self._read().descendants(run_id)

    def run_ids(self, **kwargs: str) -> Iterable[str]:
        return self._read().run_ids(**kwargs)

    def run_url(self, run_id: str) -> Optional[str]:
        return self._read().run_url(run_id)


# ---------------------------------------------------------------------------- the child


def _build(name: str, config: Optional[str]) -> TrackerBase:
    for attempt in range(BUILD_RETRIES):
        try:
            tracker = build_trackers({name: config})[0]
            client = getattr(tracker, "client", None)
            if client is not None:  # MLflow opens (and may create) its store lazily: now
                client.search_experiments(max_results=1)
            return tracker
        except Exception:
            if attempt == BUILD_RETRIES - 1:
                raise
            time.sleep(1 + attempt)
    raise AssertionError("unreachable")


def serve(lines: Iterable[bytes], out: IO[str]) -> int:
    """Apply each call in order; a failed call is logged and the next one still runs."""
    trackers: Dict[Tuple[str, Optional[str], str], TrackerBase] = {}
    failures: List[str] = []
    for raw in lines:
        message = json.loads(raw)
        if "flush" in message:
            out.write(message["flush"] + "\n")
            out.flush()
            continue
        env = message.get("env") or {}
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        key = (message["tracker"], message.get("config"), json.dumps(env, sort_keys=True))
        try:
            if key not in trackers:
                trackers[key] = _build(key[0], key[1])
            getattr(trackers[key], message["method"])(**message["kwargs"])
        except Exception:
            logger.exception("tracker %s: %s failed", key[0], message["method"])
            failures.append(message["method"])
    return 1 if failures else 0


def lower_priority() -> None:
    """Recording can wait; the job's ranks cannot: take only CPU they leave idle
    (measured: an agent at normal priority added seconds to a 1x2 DDP job's first step)."""
    try:
        os.nice(19)
        if os.getsid(0) == os.getpid():  # a new session is its own autogroup on Linux
            with open("/proc/self/autogroup", "w") as f:
                f.write("19")
    except OSError:
        pass


def log_to_stderr(who: str = "torchx tracker agent") -> None:
    """Agents' messages reach the caller's stderr, named and timed."""
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {who} %(process)d: %(message)s", force=True
    )


def main() -> int:
    lower_priority()
    log_to_stderr()
    return serve(sys.stdin.buffer, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
